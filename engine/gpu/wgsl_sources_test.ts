// engine/gpu/wgsl_sources.ts: the module graph carries every file in wgsl/, with its text as it
// is on disk, so a compiled binary or a stage without read access has all the kernels.

import assert from "node:assert/strict";
import { WGSL_SOURCES } from "./wgsl_sources.ts";

const WGSL = new URL("../../wgsl/", import.meta.url);

Deno.test("the module graph carries every file in wgsl/, as it is on disk", () => {
  const onDisk = [
    ...[...Deno.readDirSync(WGSL)].map((e) => e.name),
    ...[...Deno.readDirSync(new URL("_include/", WGSL))].map((e) => `_include/${e.name}`),
  ].filter((name) => name.endsWith(".wgsl")).sort();
  assert.deepEqual([...WGSL_SOURCES.keys()].sort(), onDisk);
  for (const name of onDisk) {
    assert.equal(WGSL_SOURCES.get(name), Deno.readTextFileSync(new URL(name, WGSL)), name);
  }
});
