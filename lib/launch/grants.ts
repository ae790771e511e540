// What each role may touch: the launcher thread's grant (deno.json tasks, compiled binaries) and
// the narrow grant its role thread runs under, derived from the role's own flags.
// Read by lib/launch/launch.ts when a head or worker starts, and by tools/compile.ts.
//
// Files are granted as their links resolve: Deno checks an open against the path opened and an
// open file's stat against the file it is, so the role opens the resolved files, and the grant
// names those alone, never a link that could later point elsewhere.

import {
  describePath,
  type ModelFiles,
  type ResolvedPath,
  resolveModelFiles,
  resolvePath,
} from "../../engine/gguf/model_files.ts";

export type Role = "head" | "worker";

/**
 * The launcher thread's grant, the same for `deno task head|worker` (deno.json) and the binaries
 * (tools/compile.ts): enough to hand any narrower grant down. The role thread runs everything
 * else, under roleGrant's grant.
 */
export const LAUNCHER_FLAGS: readonly string[] = [
  "--no-prompt",
  "--unstable-worker-options",
  "--allow-net",
  "--allow-read",
  "--allow-env=TANDEM_*",
  "--allow-ffi",
];

/** The flags of either role that say what it touches (names as in main.ts / worker.ts). */
export interface RoleFlags {
  readonly model: string;
  readonly host: string;
  readonly port: number;
  readonly next?: string;
  readonly "key-file"?: string;
  /** The head's only. */
  readonly "api-key-file"?: string;
  readonly backend: string;
  readonly gpu: string;
  /** A loopback port the role also listens on and connects to (the head's guarded server). */
  readonly internal?: number;
  /**
   * Whether the role starts Web Workers of its own (the head's tokenizer thread): Deno reads
   * their modules at run time, so the role may read its own code.
   */
  readonly threads?: boolean;
}

/** The folders of this program's own code: its modules and the npm packages they import. */
export function codeFolders(): string[] {
  return ["../../lib/", "../../engine/", "../../node_modules/"]
    .map((p) => new URL(p, import.meta.url))
    .filter((u) => {
      try {
        return Deno.statSync(u).isDirectory;
      } catch {
        return false;
      }
    })
    .map((u) => decodeURIComponent(u.pathname));
}

/** A grant as Deno's worker permissions take it; every kind is listed, so none is inherited. */
export interface Grant {
  readonly net: string[];
  readonly read: string[];
  readonly env: string[];
  readonly ffi: string[] | false;
  readonly write: false;
  readonly run: false;
  readonly sys: false;
  readonly import: false;
}

/** The files a role reads, as its flags name them and as they resolve: what its grant names. */
export interface RoleFiles {
  readonly model: ModelFiles;
  readonly "key-file"?: ResolvedPath;
  readonly "api-key-file"?: ResolvedPath;
}

/**
 * Resolves the files `flags` name through their links; run by the launcher, which may still read
 * everything. A model's shards are each resolved from their names beside the given first one.
 */
export function resolveRoleFiles(flags: RoleFlags): RoleFiles {
  const key = flags["key-file"];
  const apiKey = flags["api-key-file"];
  return {
    model: resolveModelFiles(flags.model),
    ...(key ? { "key-file": resolvePath(key) } : {}),
    ...(apiKey ? { "api-key-file": resolvePath(apiKey) } : {}),
  };
}

/** Every resolved file of `files`, with the path it was given by. */
function fileList(files: RoleFiles): ResolvedPath[] {
  return [
    ...files.model.files,
    ...(files["key-file"] ? [files["key-file"]] : []),
    ...(files["api-key-file"] ? [files["api-key-file"]] : []),
  ];
}

/** host:port as --allow-net writes it (IPv6 in brackets). */
function netAddress(host: string, port: number): string {
  return host.includes(":") && !host.startsWith("[") ? `[${host}]:${port}` : `${host}:${port}`;
}

/**
 * The folder holding this platform's Dawn addon (npm package webgpu), which the GPU backend
 * loads through FFI when --gpu is auto or dawn; undefined where the package has none.
 */
export function dawnFolder(): string | undefined {
  const os = Deno.build.os === "darwin"
    ? "darwin"
    : Deno.build.os === "windows"
    ? "win32"
    : "linux";
  const arch = os === "darwin" ? "universal" : Deno.build.arch === "aarch64" ? "arm64" : "x64";
  const folder = new URL(`./dist/${os}-${arch}/`, import.meta.resolve("webgpu"));
  try {
    return Deno.statSync(folder).isDirectory ? decodeURIComponent(folder.pathname) : undefined;
  } catch {
    return undefined;
  }
}

/**
 * The role thread's grant: net to its listen address, its next hop and its internal loopback port
 * (if any); read of its resolved model files (every file of a gguf-split) and key files; the
 * TANDEM_* environment; FFI only to Dawn's addon, and only when the GPU backend may use Dawn. No
 * write, run, sys or remote import.
 */
export function roleGrant(flags: RoleFlags, files: RoleFiles, dawn: string | undefined): Grant {
  const usesDawn = flags.backend === "gpu" && flags.gpu !== "builtin" && dawn !== undefined;
  return {
    net: [
      netAddress(flags.host, flags.port),
      ...(flags.next ? [flags.next] : []),
      ...(flags.internal ? [netAddress("127.0.0.1", flags.internal)] : []),
    ],
    read: [...fileList(files).map((f) => f.resolved), ...(flags.threads ? codeFolders() : [])],
    env: ["TANDEM_*"],
    ffi: usesDawn ? [dawn] : false,
    write: false,
    run: false,
    sys: false,
    import: false,
  };
}

/**
 * One line for the start-up log: what the role thread may touch; a file reached through a link as
 * "given -> resolved".
 */
export function describeGrant(grant: Grant, files: RoleFiles): string {
  const shown = new Map(fileList(files).map((f) => [f.resolved, describePath(f)]));
  const read = grant.read.map((p) => shown.get(p) ?? p);
  return `net ${grant.net.join(", ")}; read ${read.join(", ")}; env ` +
    `${grant.env.join(", ")}; ffi ${
      grant.ffi ? grant.ffi.join(", ") : "none"
    }; no write, run or sys`;
}
