// tools/compile.ts: what each binary embeds, for every target and role, checked from the file list
// `deno compile` builds (no runtime needed); and that the checks catch what must stay out.

import assert from "node:assert/strict";
import {
  embeddedPackages,
  embeddedProblems,
  parseEmbedded,
  ROLE_THREADS,
  RUNTIME_PACKAGES,
  TARGETS,
  verifyBinary,
} from "./compile.ts";

const MIB = 1024 ** 2;

/** A listing in `deno compile`'s NO_COLOR layout. */
const LISTING = `Compile main.ts to tandem-head

Embedded Files

tandem-head
├─┬ .deno_compile_node_modules (156.32MB - 156.3MB unique)
│ └─┬ localhost (156.32MB - 156.3MB unique)
│   ├─┬ @huggingface (745.62KB - 745.61KB unique)
│   │ ├── jinja/* (392.85KB)
│   │ └── tokenizers/* (352.78KB - 352.76KB unique)
│   ├── openai/7.59.0/* (24.4MB)
│   └── webgpu/0.6.2/* (131.12MB - 131.08MB unique)
├─┬ engine (568.3KB)
│ └── hparams.ts (11.21KB)
├── main.ts (26.52KB)
└── wgsl/* (60.23KB)

Files: 156.94MB
Metadata: 2.32KB
`;

Deno.test("the checks name a test-only package, other platforms' Dawn and missing WGSL", () => {
  const { entries, total } = parseEmbedded(LISTING);
  assert.equal(total, 156.94 * MIB);
  assert.deepEqual(entries.find((e) => e.path.endsWith("tokenizers/*")), {
    path: ".deno_compile_node_modules/localhost/@huggingface/tokenizers/*",
    bytes: 352.78 * 1024,
  });
  assert.deepEqual(embeddedPackages(entries), [
    "@huggingface/jinja",
    "@huggingface/tokenizers",
    "openai",
    "webgpu",
  ]);
  const problems = embeddedProblems(entries, { webgpu: 20.88 * MIB, wgsl: 99 * 1024 });
  assert.equal(problems.length, 3);
  assert.match(problems[0], /npm package openai, which no role imports/);
  assert.match(problems[1], /131\.12 MiB of the webgpu package, expected 20\.88 MiB/);
  assert.match(problems[2], /0\.06 MiB WGSL; wgsl\/ holds 0\.10 MiB/);
  assert.deepEqual(
    embeddedProblems(entries.filter((e) => !e.path.includes("openai")), {
      webgpu: 131.12 * MIB,
      wgsl: 60.23 * 1024,
    }),
    [],
  );
});

Deno.test("every binary embeds its role's code, the WGSL and its own platform's Dawn only", async () => {
  for (const target of Object.keys(TARGETS)) {
    for (const role of ["head", "worker"] as const) {
      const r = await verifyBinary(role, target);
      const what = `tandem-${role}-${target}`;
      assert.deepEqual(r.problems, [], what);
      assert.equal(r.path, undefined, `${what}: an empty runtime must not give a binary`);
      const packages = embeddedPackages(r.entries);
      assert.ok(packages.every((p) => RUNTIME_PACKAGES.includes(p)), `${what}: ${packages}`);
      // Only the head tokenizes; the worker's graph never reaches the tokenizer packages.
      assert.equal(packages.includes("@huggingface/tokenizers"), role === "head", what);
      assert.ok(r.entries.some((e) => e.path === (role === "head" ? "main.ts" : "worker.ts")));
      // Modules started as Web Workers are embedded too.
      for (const m of ROLE_THREADS[role]) {
        assert.ok(r.entries.some((e) => e.path.endsWith(m.split("/").at(-1)!)), `${what}: ${m}`);
      }
      assert.ok(r.total < 40 * MIB, `${what} embeds ${r.total} bytes`);
    }
  }
});
