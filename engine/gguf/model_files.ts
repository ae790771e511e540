// A model's files as the operator named them and as they are on disk, behind symbolic links: what a
// launcher grants (lib/launch/grants.ts) and what openGguf (read.ts) opens under that grant.
//
// A gguf-split's shards are named beside the given first shard, never beside its target: in the
// Hugging Face cache each snapshots/<rev>/m-0000i-of-0000N.gguf is its own link into blobs/<sha>.

import { splitPaths } from "./format.ts";

/** A path as given and the file it names once every symbolic link on the way is followed. */
export interface ResolvedPath {
  readonly given: string;
  readonly resolved: string;
}

/** A model as given, with each of its files resolved. */
export interface ModelFiles {
  /** The path as given: it names the model in messages and gives its id. */
  readonly path: string;
  /** Every file of the model in shard order: its name beside `path`, and where that leads. */
  readonly files: readonly ResolvedPath[];
}

/** What openGguf opens: a path (its links followed by whoever opens it), or resolved files. */
export type ModelSource = string | ModelFiles;

/** `p` for a message: "given", or "given -> resolved" when a link led elsewhere. */
export function describePath(p: ResolvedPath): string {
  return p.given === p.resolved ? p.given : `${p.given} -> ${p.resolved}`;
}

/** The path that names the model of `source`. */
export function modelPath(source: ModelSource): string {
  return typeof source === "string" ? source : source.path;
}

/**
 * `given` and the absolute file it names. A missing file stays as given, so that opening it fails
 * with the opener's own message (a missing shard is named with what to download).
 */
export function resolvePath(given: string): ResolvedPath {
  try {
    return { given, resolved: Deno.realPathSync(given) };
  } catch (e) {
    if (e instanceof Deno.errors.NotFound) return { given, resolved: given };
    throw new Error(
      `Cannot follow "${given}" to its file: ${(e as Error).message}; fix the link or give the ` +
        `file's own path`,
      { cause: e },
    );
  }
}

/** Every file of the model whose first (or only) file is `path`, each resolved. */
export function resolveModelFiles(path: string): ModelFiles {
  return { path, files: splitPaths(path).map(resolvePath) };
}
