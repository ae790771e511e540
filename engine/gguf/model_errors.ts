// Errors about what a model file holds name the file. The readers of its metadata (hparams, the
// tokenizer) know the key, value and expectation at fault but not the file: callers that hold the
// model wrap them here, once, instead of every reader taking a file name to quote.

/** The error classes the readers throw, which a named copy keeps. */
const KINDS: readonly (new (message: string, options?: ErrorOptions) => Error)[] = [
  SyntaxError,
  RangeError,
  TypeError,
  Error,
];

/**
 * `e` naming the model file `path`: "Cannot X: why" becomes "Cannot X from "path": why", of the
 * same class, with `e` as its cause. An error that names the file already, or of another class,
 * is returned as it is.
 */
export function namingFile(e: unknown, path: string): unknown {
  const kind = KINDS.find((k) => e instanceof Error && e.constructor === k);
  if (!kind || (e as Error).message.includes(`"${path}"`)) return e;
  const message = (e as Error).message;
  const head = /^Cannot (.*?): /.exec(message);
  return new kind(
    head
      ? `Cannot ${head[1]} from "${path}": ${message.slice(head[0].length)}`
      : `Cannot use "${path}": ${message}`,
    { cause: e },
  );
}

/** `read()`, its errors naming the model file `path`. */
export function readingFile<T>(path: string, read: () => T): T {
  try {
    return read();
  } catch (e) {
    throw namingFile(e, path);
  }
}
