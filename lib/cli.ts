// The command-line plumbing of every task (head, worker, generate, make-model, demo, bench): a
// declarative flag table per command → parsing, validation, --help and TANDEM_* environment values.
//
// A flag is one line of its command's table, e.g.
//   port: flag(whole(0, 65535), "the HTTP port; 0 picks a free one", 8080),
// and reads from `--port 8080`, `--port=8080` or the environment variable TANDEM_PORT (a flag on
// the command line wins). Checks that involve several flags throw UsageError from the command.

import { parseArgs } from "node:util";
import { PROVIDER_CHOICES } from "../engine/gpu/provider.ts";
import { BACKENDS, type EngineChoice } from "../engine/open_stage.ts";
import { DEFAULT_SILENCE_MS, MIN_SILENCE_MS } from "./wire/liveness.ts";
import { parseAddress } from "./wire/peer.ts";

/** How a flag's text becomes its value; `parse` throws an Error whose message says what fits. */
export interface Kind<T> {
  /** The value's shape in --help ("N", "host:port"); null for a switch, which takes none. */
  readonly value: string | null;
  parse(text: string): T;
}

export interface Flag<T> {
  readonly kind: Kind<NonNullable<T>>;
  readonly meaning: string;
  /** The value when neither the command line nor the environment gives one. */
  readonly fallback: T;
  readonly required: boolean;
}

// deno-lint-ignore no-explicit-any -- a table holds flags of many value types
export type FlagTable = Readonly<Record<string, Flag<any>>>;

export type FlagValues<F extends FlagTable> = {
  readonly [K in keyof F]: F[K] extends Flag<infer T> ? T : never;
};

export interface Command<F extends FlagTable> {
  /** What errors are prefixed with: "Head stopped: …". */
  readonly name: string;
  /** How it is started, e.g. "deno task head". */
  readonly usage: string;
  /** What it does, printed under the usage line by --help. */
  readonly about: string;
  readonly flags: F;
}

/** Bad flags: the process prints the message and a pointer to --help, and exits with code 2. */
export class UsageError extends Error {
  override name = "UsageError";
}

/** A flag with a default value. */
export function flag<T>(kind: Kind<NonNullable<T>>, meaning: string, fallback: NoInfer<T>): Flag<T>;
/** A flag that may be absent (its value is then undefined). */
export function flag<T>(kind: Kind<T>, meaning: string): Flag<T | undefined>;
export function flag<T>(kind: Kind<T>, meaning: string, fallback?: T): Flag<T | undefined> {
  return { kind: kind as Kind<NonNullable<T>>, meaning, fallback, required: false };
}

/** A flag the command cannot run without. */
export function requiredFlag<T>(kind: Kind<NonNullable<T>>, meaning: string): Flag<T> {
  return { kind, meaning, fallback: undefined as T, required: true };
}

/** An on/off flag: present means on; the environment says 1/0, true/false or yes/no. */
export function switchFlag(meaning: string): Flag<boolean> {
  return { kind: SWITCH, meaning, fallback: false, required: false };
}

const SWITCH: Kind<boolean> = {
  value: null,
  parse(text) {
    const t = text.trim().toLowerCase();
    if (["1", "true", "yes", "on"].includes(t)) return true;
    if (["0", "false", "no", "off", ""].includes(t)) return false;
    throw new Error("expected 1 or 0 (true/false, yes/no)");
  },
};

/** Any text; `value` names it in --help (PATH, NAME, ...). */
export function text(value = "TEXT"): Kind<string> {
  return { value, parse: (t) => t };
}

/** A whole number in [min, max]. */
export function whole(min: number, max = Number.MAX_SAFE_INTEGER): Kind<number> {
  return {
    value: "N",
    parse(t) {
      const n = Number(t);
      if (!/^\d+$/.test(t.trim()) || n < min || n > max) {
        throw new Error(
          max === Number.MAX_SAFE_INTEGER
            ? `expected a whole number ≥ ${min}`
            : `expected a whole number from ${min} to ${max}`,
        );
      }
      return n;
    },
  };
}

/** A number in [min, max]. */
export function decimal(min: number, max: number): Kind<number> {
  return {
    value: "X",
    parse(t) {
      const n = Number(t);
      if (t.trim() === "" || !Number.isFinite(n) || n < min || n > max) {
        throw new Error(`expected a number from ${min} to ${max}`);
      }
      return n;
    },
  };
}

/** One of a fixed set of words. */
export function oneOf<T extends string>(choices: readonly T[]): Kind<T> {
  return {
    value: choices.join("|"),
    parse(t) {
      if (!(choices as readonly string[]).includes(t)) {
        throw new Error(`expected one of ${choices.join(", ")}`);
      }
      return t as T;
    },
  };
}

/** Comma-separated values of another kind, e.g. `--pp 512,2048`. */
export function listOf<T>(kind: Kind<T>, value = `${kind.value},...`): Kind<T[]> {
  return {
    value,
    parse(t) {
      const parts = t.split(",").map((s) => s.trim());
      try {
        return parts.map((p) => kind.parse(p));
      } catch (e) {
        throw new Error(`${(e as Error).message}, comma-separated`);
      }
    },
  };
}

/** A layer range `a:b` (first layer, end layer exclusive), a < b. */
export const layerRange: Kind<{ readonly first: number; readonly end: number }> = {
  value: "a:b",
  parse(t) {
    const m = /^(\d+):(\d+)$/.exec(t);
    if (!m || Number(m[1]) >= Number(m[2])) throw new Error("expected a:b with a < b, e.g. 0:20");
    return { first: Number(m[1]), end: Number(m[2]) };
  },
};

/** A `host:port` address (IPv6 in brackets), kept as text. */
export const address: Kind<string> = {
  value: "host:port",
  parse(t) {
    try {
      parseAddress(t);
    } catch (e) {
      throw new Error("expected host:port, e.g. 10.0.0.2:9000", { cause: e });
    }
    return t;
  },
};

/** The GGUF a stage-opening command loads. */
export const MODEL_FLAG = requiredFlag(
  text("PATH"),
  "the GGUF file (the first shard of a split model)",
);

/** How long the next stage may send nothing, for the head and a worker with --next. */
export const SILENCE_FLAG = flag(
  decimal(MIN_SILENCE_MS / 1000, 3600),
  "seconds --next may send nothing (no reply, no sign of life) before it counts as down and " +
    "what it was running fails over (docs/DEPLOY.md)",
  DEFAULT_SILENCE_MS / 1000,
);

/** The engine flags of every command that opens a stage (engine/open_stage.ts). */
export const ENGINE_FLAGS = {
  backend: flag(oneOf(BACKENDS), "the engine", "gpu"),
  gpu: flag(oneOf(PROVIDER_CHOICES), "the WebGPU provider", "auto"),
  "allow-software-gpu": switchFlag("run on a software (CPU) WebGPU adapter"),
};

/** The engine ENGINE_FLAGS' values choose, as engine/open_stage.ts opens stages on it. */
export function engineChoice(values: FlagValues<typeof ENGINE_FLAGS>): EngineChoice {
  return {
    backend: values.backend,
    gpu: values.gpu,
    allowSoftwareGpu: values["allow-software-gpu"],
  };
}

/** The environment variable a flag also reads: --max-batch → TANDEM_MAX_BATCH. */
export function envName(flagName: string): string {
  return `TANDEM_${flagName.toUpperCase().replaceAll("-", "_")}`;
}

/**
 * The flag values of `args` over those of the environment over the defaults; null when --help
 * (or -h) is given. Throws UsageError naming the flag (or variable), its text and what fits.
 */
export function readFlags<F extends FlagTable>(
  command: Command<F>,
  args: readonly string[],
  env: (name: string) => string | undefined,
): FlagValues<F> | null {
  const options: Record<string, { type: "string" | "boolean"; short?: string }> = {
    help: { type: "boolean", short: "h" },
  };
  for (const [name, f] of Object.entries(command.flags)) {
    options[name] = { type: f.kind.value === null ? "boolean" : "string" };
  }
  let given: Record<string, string | boolean | undefined>;
  try {
    given = parseArgs({ args: [...args], options, strict: true, allowPositionals: false }).values;
  } catch (e) {
    throw new UsageError(`Cannot parse the arguments: ${(e as Error).message}`);
  }
  if (given.help) return null;
  const values: Record<string, unknown> = {};
  for (const [name, f] of Object.entries(command.flags)) {
    const arg = given[name];
    const variable = envName(name);
    const fromEnv = env(variable);
    const [source, raw] = arg !== undefined
      ? [`--${name}`, arg === true ? "1" : String(arg)]
      : fromEnv !== undefined
      ? [variable, fromEnv]
      : [undefined, undefined];
    if (raw === undefined) {
      if (f.required) {
        throw new UsageError(`Missing --${name} (or ${variable}): ${f.meaning}`);
      }
      values[name] = f.fallback;
      continue;
    }
    try {
      values[name] = f.kind.parse(raw);
    } catch (e) {
      throw new UsageError(`Cannot use ${source} "${raw}": ${(e as Error).message}`);
    }
  }
  return values as FlagValues<F>;
}

/** Words of `text` in lines of at most `width` characters. */
function wrap(text: string, width: number): string {
  const lines = [""];
  for (const word of text.split(/\s+/)) {
    const line = lines[lines.length - 1];
    if (line && line.length + 1 + word.length > width) lines.push(word);
    else lines[lines.length - 1] = line ? `${line} ${word}` : word;
  }
  return lines.join("\n");
}

/** A default as one would type it: 8080, 127.0.0.1, 512,2048, "a prompt with spaces". */
function showValue(value: unknown): string {
  if (Array.isArray(value)) return value.join(",");
  const text = String(value);
  return /\s/.test(text) || text === "" ? JSON.stringify(text) : text;
}

/** --help: the usage line, what the command does, and every flag with its default and meaning. */
export function helpText(command: Command<FlagTable>): string {
  const rows: [string, string][] = Object.entries(command.flags).map(([name, f]) => {
    const shown = f.fallback === undefined || f.fallback === false
      ? ""
      : ` (default ${showValue(f.fallback)})`;
    return [
      `--${name}${f.kind.value === null ? "" : ` ${f.kind.value}`}`,
      f.required ? `required: ${f.meaning}` : `${f.meaning}${shown}`,
    ];
  });
  rows.push(["-h, --help", "print this help and exit"]);
  const width = Math.min(32, Math.max(...rows.map(([left]) => left.length)) + 2);
  const lines = rows.map(([left, right]) =>
    left.length + 2 > width
      ? `  ${left}\n  ${" ".repeat(width)}${right}`
      : `  ${left.padEnd(width)}${right}`
  );
  return [
    `Usage: ${command.usage} [flags]`,
    wrap(command.about, 100),
    "",
    "Flags (each also read from TANDEM_<FLAG>, e.g. --max-batch from TANDEM_MAX_BATCH; the " +
    "command line wins):",
    ...lines,
  ].join("\n");
}

/** Deno.env, read only where the process may (a worker may run without --allow-env). */
function readEnv(name: string): string | undefined {
  const state = Deno.permissions.querySync({ name: "env", variable: name }).state;
  return state === "granted" ? Deno.env.get(name) : undefined;
}

/**
 * Runs a command-line entry point: --help prints and exits 0; a UsageError (from the flags or
 * from `main`) prints its message and exits 2; any other error prints one line and exits 1.
 */
export async function runCommand<F extends FlagTable>(
  command: Command<F>,
  main: (values: FlagValues<F>) => Promise<void>,
): Promise<void> {
  try {
    const values = readFlags(command, Deno.args, readEnv);
    if (values === null) {
      console.log(helpText(command));
      Deno.exit(0);
    }
    await main(values);
  } catch (e) {
    if (e instanceof UsageError) {
      console.error(`${e.message}\n"${command.usage} --help" lists every flag.`);
      Deno.exit(2);
    }
    console.error(`${command.name} stopped: ${(e as Error).message}`);
    Deno.exit(1);
  }
}

/** Whether a listen address reaches only this machine (a key or --insecure is needed otherwise). */
export function isLoopback(host: string): boolean {
  return host === "localhost" || host === "::1" || /^127\.\d+\.\d+\.\d+$/.test(host);
}

/** A bind failure as an error that names the address and the flag that moves it. */
export function listenError(hostname: string, port: number, e: unknown, flags: string): Error {
  const where = `${hostname}:${port}`;
  const reason = e instanceof Deno.errors.AddrInUse
    ? `the port is in use by another process; stop it or choose another port with ${flags}`
    : e instanceof Deno.errors.AddrNotAvailable
    ? `no interface of this machine has that address; check ${flags}`
    : `${(e as Error).message}; check ${flags}`;
  return new Error(`Cannot listen on ${where}: ${reason}`, { cause: e });
}
