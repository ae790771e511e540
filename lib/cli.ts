// Flag parsing shared by the command-line entry points (main.ts, tools/demo.ts, make_model.ts,
// bench/decode.ts): a flag node:util cannot parse goes to the caller's usage-and-exit `fail`.

import { parseArgs, type ParseArgsConfig } from "node:util";

/** parseArgs(config).values, or `fail` with parseArgs's reason. */
export function parseCommandLine<T extends ParseArgsConfig>(
  config: T,
  fail: (message: string) => never,
): ReturnType<typeof parseArgs<T>>["values"] {
  try {
    return parseArgs(config).values;
  } catch (e) {
    fail(`Cannot parse the arguments: ${(e as Error).message}`);
  }
}
