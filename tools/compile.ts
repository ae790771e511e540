// `deno task compile`: tandem-head and tandem-worker as single binaries per platform, into dist/.
// Packaging beside the data path: each binary embeds its role's module graph (WGSL included), the
// npm packages that graph reaches, and Dawn's native addon for its own platform only.
//
//   deno task compile [--target linux-x64,...] [--role head,worker] [--out dist] [--verify]
//
// A binary is a Deno runtime (`denort`) plus the embedded files. `deno compile` downloads the
// runtime of each target; DENORT_BIN names a local one instead (for one target). --verify builds
// the embedded file list of every binary against an empty runtime, checks it and writes nothing,
// which works without the runtimes (tools/compile_test.ts runs it).

import {
  type Command,
  flag,
  type FlagTable,
  listOf,
  oneOf,
  runCommand,
  switchFlag,
  text,
  UsageError,
} from "../lib/cli.ts";
import { LAUNCHER_FLAGS, type Role } from "../lib/launch/grants.ts";

/** The entry module of each role, relative to the project root. */
const ROLE_ENTRIES: Readonly<Record<Role, string>> = { head: "main.ts", worker: "worker.ts" };

/**
 * Modules a role starts as Web Workers besides its entry (which is its own role thread): deno
 * compile embeds a worker's module only when told to.
 */
export const ROLE_THREADS: Readonly<Record<Role, readonly string[]>> = {
  head: ["lib/tokenizer/tokenizer_worker.ts"],
  worker: [],
};

export interface Target {
  /** Deno's target triple. */
  readonly triple: string;
  /** The folder of the npm package webgpu holding this platform's dawn.node. */
  readonly dawn: string;
  readonly exe: string;
}

export const TARGETS: Readonly<Record<string, Target>> = {
  "linux-x64": { triple: "x86_64-unknown-linux-gnu", dawn: "linux-x64", exe: "" },
  "linux-arm64": { triple: "aarch64-unknown-linux-gnu", dawn: "linux-arm64", exe: "" },
  "macos-arm64": { triple: "aarch64-apple-darwin", dawn: "darwin-universal", exe: "" },
  "macos-x64": { triple: "x86_64-apple-darwin", dawn: "darwin-universal", exe: "" },
  "windows-x64": { triple: "x86_64-pc-windows-msvc", dawn: "win32-x64", exe: ".exe" },
};

/** npm packages a binary may embed: what the roles import, and what those import. */
export const RUNTIME_PACKAGES = [
  "@huggingface/jinja",
  "@huggingface/tokenizers",
  "@webgpu/types",
  "debug",
  "ms",
  "webgpu",
];

const PROJECT = decodeURIComponent(new URL("../", import.meta.url).pathname).replace(/\/$/, "");

let webgpuFolder: Promise<string> | undefined;

/**
 * The locked webgpu package in deno's npm cache, where `deno compile` reads it from (the binaries
 * embed packages from the cache, not from node_modules/).
 */
function webgpuPackage(): Promise<string> {
  webgpuFolder ??= (async () => {
    const info = await new Deno.Command(Deno.execPath(), { args: ["info", "--json"] }).output();
    const { npmCache } = JSON.parse(new TextDecoder().decode(info.stdout)) as { npmCache: string };
    const lock = JSON.parse(await Deno.readTextFile(`${PROJECT}/deno.lock`)) as {
      npm: Record<string, unknown>;
    };
    const key = Object.keys(lock.npm).find((k) => k.startsWith("webgpu@"));
    if (!key) {
      throw new Error("Cannot compile: deno.lock has no npm package webgpu; run deno install");
    }
    return `${npmCache}/registry.npmjs.org/webgpu/${key.slice("webgpu@".length)}`;
  })();
  return webgpuFolder;
}

/** The `deno compile` arguments of one binary. */
export async function compileArgs(role: Role, target: string, out: string): Promise<string[]> {
  const t = TARGETS[target];
  const dawn = await webgpuPackage();
  const others = Object.values(TARGETS).map((x) => x.dawn).filter((d) => d !== t.dawn);
  return [
    "compile",
    "--no-check",
    // Packages come from the npm cache, and only those the module graph reaches: the SDKs the
    // tests use stay out, as does everything else in node_modules.
    "--node-modules-dir=none",
    "--exclude-unused-npm",
    ...[...new Set(others), "win32-arm64"].map((d) => `--exclude=${dawn}/dist/${d}`),
    `--exclude=${dawn}/build`,
    ...ROLE_THREADS[role].map((m) => `--include=${PROJECT}/${m}`),
    ...LAUNCHER_FLAGS,
    "--target",
    t.triple,
    "--output",
    `${out}/tandem-${role}-${target}${t.exe}`,
    `${PROJECT}/${ROLE_ENTRIES[role]}`,
  ];
}

/** One line of `deno compile`'s "Embedded Files" tree: a file, or a folder with its total. */
export interface Embedded {
  /** Path inside the binary, "/"-joined: "engine/gpu/wgsl.ts", "wgsl/*". */
  readonly path: string;
  readonly bytes: number;
}

const UNITS: Readonly<Record<string, number>> = { B: 1, KB: 1024, MB: 1024 ** 2, GB: 1024 ** 3 };
const TREE_LINE = /^([│├└─┬ ]*)(\S.*?) \(([\d.]+)(B|KB|MB|GB)(?: - [^)]*)?\)$/;

/**
 * The embedded files and folders `deno compile` lists (NO_COLOR output), with sizes rounded as
 * printed, and the total of the "Files:" line.
 */
export function parseEmbedded(output: string): { entries: Embedded[]; total: number } {
  const lines = output.split("\n");
  const start = lines.findIndex((l) => l.trim() === "Embedded Files");
  if (start < 0) throw new Error(`Cannot find the embedded file list in:\n${output}`);
  const entries: Embedded[] = [];
  const stack: string[] = [];
  let total = -1;
  for (const line of lines.slice(start + 1)) {
    const files = /^Files: ([\d.]+)(B|KB|MB|GB)$/.exec(line.trim());
    if (files) {
      total = Number(files[1]) * UNITS[files[2]];
      break;
    }
    const m = TREE_LINE.exec(line);
    if (!m) continue;
    const depth = (m[1].length - 4) / 2;
    stack.length = depth;
    stack.push(m[2]);
    entries.push({ path: stack.join("/"), bytes: Number(m[3]) * UNITS[m[4]] });
  }
  if (total < 0) throw new Error(`Cannot find the "Files:" total in:\n${output}`);
  return { entries, total };
}

/** A size in MiB for reports. */
function mib(bytes: number): string {
  return `${(bytes / 1024 ** 2).toFixed(2)} MiB`;
}

async function folderBytes(path: string): Promise<number> {
  let n = 0;
  for await (const e of Deno.readDir(path)) {
    const p = `${path}/${e.name}`;
    n += e.isDirectory ? await folderBytes(p) : (await Deno.stat(p)).size;
  }
  return n;
}

/** What one binary may hold, measured from the files on this machine. */
export interface Expected {
  /** Bytes of the webgpu package with only the target's Dawn. */
  readonly webgpu: number;
  /** Bytes of wgsl/. */
  readonly wgsl: number;
}

/** Printed sizes are rounded to 0.01 of their unit. */
const ROUNDING = 0.01 * 1024 ** 2;
const NPM = ".deno_compile_node_modules/localhost/";

/** The npm packages in an embedded file list: "webgpu", "@huggingface/jinja", ... */
export function embeddedPackages(entries: readonly Embedded[]): string[] {
  return [
    ...new Set(entries.flatMap((e) => {
      if (!e.path.startsWith(NPM)) return [];
      const parts = e.path.slice(NPM.length).split("/");
      const name = parts[0].startsWith("@") ? parts.slice(0, 2) : parts.slice(0, 1);
      // A scope's own line ("@huggingface") names no package.
      return name.length === 2 || !name[0].startsWith("@") ? [name.join("/")] : [];
    })),
  ];
}

/**
 * What an embedded file list breaks: a package no role imports (the tests' SDKs), Dawn natives of
 * other platforms, WGSL missing. [] when it holds what it should.
 */
export function embeddedProblems(entries: readonly Embedded[], expected: Expected): string[] {
  const problems = embeddedPackages(entries)
    .filter((p) => !RUNTIME_PACKAGES.includes(p))
    .map((p) => `embeds npm package ${p}, which no role imports`);
  const webgpu = entries.find((e) => e.path.startsWith(`${NPM}webgpu/`) && e.path.endsWith("/*"));
  if (webgpu && Math.abs(webgpu.bytes - expected.webgpu) > ROUNDING) {
    problems.push(
      `embeds ${mib(webgpu.bytes)} of the webgpu package, expected ${mib(expected.webgpu)} ` +
        `with its own platform's Dawn only`,
    );
  }
  const wgsl = entries.find((e) => e.path === "wgsl/*" || e.path === "wgsl");
  if (!wgsl || Math.abs(wgsl.bytes - expected.wgsl) > ROUNDING) {
    problems.push(
      `embeds ${wgsl ? mib(wgsl.bytes) : "no"} WGSL; wgsl/ holds ${mib(expected.wgsl)}`,
    );
  }
  return problems;
}

async function expectedFor(target: string): Promise<Expected> {
  const pkg = await webgpuPackage();
  const top = await folderBytes(pkg) - await folderBytes(`${pkg}/dist`) -
    await folderBytes(`${pkg}/build`);
  return {
    webgpu: top + await folderBytes(`${pkg}/dist/${TARGETS[target].dawn}`),
    wgsl: await folderBytes(`${PROJECT}/wgsl`),
  };
}

/** The last lines of a failed `deno compile` that say why, without the backtrace. */
function reason(log: string): string {
  return log.split("\n").map((l) => l.trim())
    .filter((l) => l !== "" && !/^Stack backtrace:|^\d+: <unknown>$/.test(l))
    .slice(-3).join("; ");
}

export interface BinaryReport {
  readonly role: Role;
  readonly target: string;
  /** The binary written; undefined when `deno compile` wrote none. */
  readonly path?: string;
  readonly entries: readonly Embedded[];
  readonly total: number;
  readonly problems: readonly string[];
  /** `deno compile`'s own output. */
  readonly log: string;
}

/**
 * Runs `deno compile` for one binary and checks the embedded file list it prints. `denort` is
 * the runtime to build on; without one, deno downloads the target's.
 */
export async function buildBinary(
  role: Role,
  target: string,
  out: string,
  denort?: string,
): Promise<BinaryReport> {
  const args = await compileArgs(role, target, out);
  const result = await new Deno.Command(Deno.execPath(), {
    args,
    cwd: PROJECT,
    env: { NO_COLOR: "1", ...(denort ? { DENORT_BIN: denort } : {}) },
    stdout: "piped",
    stderr: "piped",
  }).output();
  const log = new TextDecoder().decode(result.stdout) + new TextDecoder().decode(result.stderr);
  if (!log.includes("Embedded Files")) {
    throw new Error(
      `Cannot compile tandem-${role}-${target}: ${reason(log)}; ` +
        `without network, set DENORT_BIN to a denort of ${TARGETS[target].triple}, or check ` +
        `the embedded files with --verify`,
    );
  }
  const { entries, total } = parseEmbedded(log);
  return {
    role,
    target,
    path: result.success ? args[args.indexOf("--output") + 1] : undefined,
    entries,
    total,
    problems: embeddedProblems(entries, await expectedFor(target)),
    log,
  };
}

/**
 * The embedded file list of one binary, built against an empty runtime: no target can run it,
 * so `deno compile` lists the files and then stops without writing a binary. Needs no download.
 */
export async function verifyBinary(role: Role, target: string): Promise<BinaryReport> {
  const tmp = await Deno.makeTempDir({ prefix: "tandem-compile-" });
  try {
    await Deno.writeFile(`${tmp}/empty-denort`, new Uint8Array());
    return await buildBinary(role, target, tmp, `${tmp}/empty-denort`);
  } finally {
    await Deno.remove(tmp, { recursive: true });
  }
}

const ROLES: readonly Role[] = ["head", "worker"];

export const COMPILE = {
  name: "Compile",
  usage: "deno task compile",
  about: "Builds dist/tandem-<role>-<target> for each target and role: Deno's runtime (denort) " +
    "plus the role's code, its WGSL, its npm packages and its platform's Dawn addon. deno " +
    "downloads each target's runtime, or DENORT_BIN names a local one (then give one --target).",
  flags: {
    target: flag(listOf(oneOf(Object.keys(TARGETS))), "the platforms", Object.keys(TARGETS)),
    role: flag(listOf(oneOf(ROLES)), "the binaries", [...ROLES]),
    out: flag(text("DIR"), "where the binaries go", "dist"),
    verify: switchFlag(
      "list and check what each binary would embed; needs no runtime, writes nothing",
    ),
  },
} satisfies Command<FlagTable>;

if (import.meta.main) {
  await runCommand(COMPILE, async (flags) => {
    const denort = Deno.env.get("DENORT_BIN");
    if (denort && flags.target.length > 1 && !flags.verify) {
      throw new UsageError(
        `Cannot build ${flags.target.length} targets on DENORT_BIN "${denort}": it is the ` +
          `runtime of one target; give --target`,
      );
    }
    let failed = false;
    for (const target of flags.target) {
      for (const role of flags.role) {
        const r = flags.verify
          ? await verifyBinary(role, target)
          : await buildBinary(role, target, flags.out, denort);
        const what = r.path ?? `tandem-${role}-${target}`;
        console.log(`${what}: embeds ${mib(r.total)} (${embeddedPackages(r.entries).join(", ")})`);
        for (const p of r.problems) console.log(`  problem: ${p}`);
        failed ||= r.problems.length > 0 || (!flags.verify && !r.path);
      }
    }
    if (failed) throw new Error("a binary breaks the rules above, or was not written");
  });
}
