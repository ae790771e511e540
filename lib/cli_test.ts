// Unit tests of lib/cli.ts: flags from the command line over the environment over defaults, the
// errors that name the flag or variable, and --help listing every flag with default and meaning.

import assert from "node:assert/strict";
import {
  address,
  type Command,
  decimal,
  envName,
  flag,
  type FlagTable,
  helpText,
  layerRange,
  listOf,
  oneOf,
  readFlags,
  requiredFlag,
  switchFlag,
  text,
  UsageError,
  whole,
} from "./cli.ts";

const DEMO = {
  name: "Demo",
  usage: "deno task demo",
  about: "A command for these tests.",
  flags: {
    model: requiredFlag(text("PATH"), "the model file"),
    port: flag(whole(0, 65535), "the port", 8080),
    "max-batch": flag(whole(1), "positions per chunk"),
    temperature: flag(decimal(0, 2), "sampling temperature", 0),
    backend: flag(oneOf(["gpu", "reference"] as const), "the engine", "gpu"),
    layers: flag(layerRange, "the layers"),
    next: flag(address, "the next stage"),
    pp: flag(listOf(whole(1)), "prefill lengths", [512, 2048]),
    insecure: switchFlag("serve without a key"),
  },
} satisfies Command<FlagTable>;

const noEnv = () => undefined;

function usageError(args: string[], env: Record<string, string> = {}): string {
  try {
    readFlags(DEMO, args, (name) => env[name]);
  } catch (e) {
    assert.ok(e instanceof UsageError, `expected a UsageError, got ${e}`);
    return e.message;
  }
  assert.fail(`expected ${args.join(" ")} to be refused`);
}

Deno.test("flags parse into typed values, absent ones take their defaults", () => {
  const values = readFlags(DEMO, [
    "--model",
    "m.gguf",
    "--max-batch=64",
    "--temperature",
    "0.7",
    "--layers",
    "0:2",
    "--next",
    "[::1]:9000",
    "--pp",
    "128,256",
    "--insecure",
  ], noEnv)!;
  assert.deepEqual(values, {
    model: "m.gguf",
    port: 8080,
    "max-batch": 64,
    temperature: 0.7,
    backend: "gpu",
    layers: { first: 0, end: 2 },
    next: "[::1]:9000",
    pp: [128, 256],
    insecure: true,
  });
  const bare = readFlags(DEMO, ["--model", "m.gguf"], noEnv)!;
  assert.equal(bare["max-batch"], undefined);
  assert.equal(bare.insecure, false);
  assert.deepEqual(bare.pp, [512, 2048]);
});

Deno.test("every flag also comes from TANDEM_<FLAG>; the command line wins", () => {
  assert.equal(envName("max-batch"), "TANDEM_MAX_BATCH");
  const env: Record<string, string> = {
    TANDEM_MODEL: "env.gguf",
    TANDEM_PORT: "9100",
    TANDEM_MAX_BATCH: "32",
    TANDEM_INSECURE: "1",
  };
  const fromEnv = readFlags(DEMO, [], (name) => env[name])!;
  assert.equal(fromEnv.model, "env.gguf");
  assert.equal(fromEnv.port, 9100);
  assert.equal(fromEnv["max-batch"], 32);
  assert.equal(fromEnv.insecure, true);
  const given = readFlags(DEMO, ["--port", "7000"], (name) => env[name])!;
  assert.equal(given.port, 7000);
  assert.equal(readFlags(DEMO, [], (n) => ({ ...env, TANDEM_INSECURE: "no" })[n])!.insecure, false);
});

Deno.test("bad flags are refused with the flag (or variable), its text and what fits", () => {
  assert.equal(
    usageError([]),
    "Missing --model (or TANDEM_MODEL): the model file",
  );
  const m = ["--model", "m"];
  assert.equal(
    usageError([...m, "--port", "80x"]),
    'Cannot use --port "80x": expected a whole number from 0 to 65535',
  );
  assert.equal(
    usageError([...m], { TANDEM_PORT: "70000" }),
    'Cannot use TANDEM_PORT "70000": expected a whole number from 0 to 65535',
  );
  assert.equal(
    usageError([...m, "--max-batch", "0"]),
    'Cannot use --max-batch "0": expected a whole number ≥ 1',
  );
  assert.equal(
    usageError([...m, "--temperature", "3"]),
    'Cannot use --temperature "3": expected a number from 0 to 2',
  );
  assert.equal(
    usageError([...m, "--backend", "cpu"]),
    'Cannot use --backend "cpu": expected one of gpu, reference',
  );
  assert.equal(
    usageError([...m, "--layers", "3:1"]),
    'Cannot use --layers "3:1": expected a:b with a < b, e.g. 0:20',
  );
  assert.equal(
    usageError([...m, "--next", "nohost"]),
    'Cannot use --next "nohost": expected host:port, e.g. 10.0.0.2:9000',
  );
  assert.equal(
    usageError([...m, "--pp", "1,x"]),
    'Cannot use --pp "1,x": expected a whole number ≥ 1, comma-separated',
  );
  assert.equal(
    usageError([...m], { TANDEM_INSECURE: "maybe" }),
    'Cannot use TANDEM_INSECURE "maybe": expected 1 or 0 (true/false, yes/no)',
  );
  assert.match(
    usageError([...m, "--bogus"]),
    /^Cannot parse the arguments: Unknown option '--bogus'/,
  );
  assert.match(
    usageError([...m, "stray"]),
    /^Cannot parse the arguments: Unexpected argument 'stray'/,
  );
  assert.match(usageError(["--model"]), /^Cannot parse the arguments: Option '--model <value>'/);
});

Deno.test("--help and -h ask for help; the help lists every flag with its default and meaning", () => {
  assert.equal(readFlags(DEMO, ["--help"], noEnv), null);
  assert.equal(readFlags(DEMO, ["--port", "1", "-h"], noEnv), null);
  const help = helpText(DEMO);
  assert.match(help, /^Usage: deno task demo \[flags\]\nA command for these tests\./);
  assert.match(help, /TANDEM_MAX_BATCH/);
  for (const name of Object.keys(DEMO.flags)) assert.match(help, new RegExp(`--${name}\\b`));
  assert.match(help, /--model PATH +required: the model file\n/);
  assert.match(help, /--port N +the port \(default 8080\)\n/);
  assert.match(help, /--max-batch N +positions per chunk\n/);
  assert.match(help, /--backend gpu\|reference +the engine \(default gpu\)\n/);
  assert.match(help, /--pp N,\.\.\. +prefill lengths \(default 512,2048\)\n/);
  assert.match(help, /--insecure +serve without a key\n/);
  assert.match(help, /-h, --help +print this help and exit$/);
});
