// Checks each wgsl/*.wgsl against the TS kernel module that dispatches it: binding names, order
// and access, `params` last, and the Params fields' names, order and types. Also that every
// kernel file opens with its contract block. Catches host/shader drift without a GPU.

import assert from "node:assert/strict";
import type { KernelLayout } from "./kernel.ts";
import { ARGMAX } from "./kernels/argmax.ts";
import { ATTENTION, ATTENTION_COMBINE } from "./kernels/attention.ts";
import { GATED_DELTA_NET } from "./kernels/gated_delta_net.ts";
import { GET_ROWS } from "./kernels/get_rows.ts";
import { MOE_GATHER } from "./kernels/moe_gather.ts";
import { MOE_ROUTE } from "./kernels/moe_route.ts";
import { MOE_SUM } from "./kernels/moe_sum.ts";
import { MUL_MAT } from "./kernels/mul_mat.ts";
import { QK_NORM_ROPE } from "./kernels/qk_norm_rope.ts";
import { RMS_NORM } from "./kernels/rms_norm.ts";
import { SSM_CONV } from "./kernels/ssm_conv.ts";
import { TOPK } from "./kernels/topk.ts";

const LAYOUTS: readonly KernelLayout[] = [
  ARGMAX,
  ATTENTION,
  ATTENTION_COMBINE,
  GATED_DELTA_NET,
  GET_ROWS,
  MOE_GATHER,
  MOE_ROUTE,
  MOE_SUM,
  MUL_MAT,
  QK_NORM_ROPE,
  RMS_NORM,
  SSM_CONV,
  TOPK,
];

const WGSL = new URL("../../wgsl/", import.meta.url);

function source(file: string): string {
  return Deno.readTextFileSync(new URL(file, WGSL));
}

interface Binding {
  group: number;
  index: number;
  space: string;
  access: string;
  name: string;
  type: string;
}

function bindings(text: string): Binding[] {
  const re =
    /@group\((\d+)\)\s*@binding\((\d+)\)\s*var<(\w+)(?:,\s*(\w+))?>\s*(\w+)\s*:\s*([^;]+);/g;
  return [...text.matchAll(re)].map((m) => ({
    group: Number(m[1]),
    index: Number(m[2]),
    space: m[3],
    access: m[4] ?? "read",
    name: m[5],
    type: m[6].trim(),
  }));
}

function paramsFields(text: string): [string, string][] {
  const m = /struct Params\s*\{([^}]*)\}/.exec(text);
  if (!m) return [];
  return [...m[1].matchAll(/(\w+)\s*:\s*(\w+)/g)].map((f) => [f[1], f[2]]);
}

Deno.test("every kernel file in wgsl/ has a TS layout", () => {
  const files = [...Deno.readDirSync(WGSL)]
    .filter((e) => e.isFile && e.name.endsWith(".wgsl"))
    .map((e) => e.name)
    .sort();
  assert.deepEqual(files, LAYOUTS.map((l) => l.file).sort());
});

for (const layout of LAYOUTS) {
  Deno.test(`${layout.file} matches its TS layout`, () => {
    const text = source(layout.file);
    const found = bindings(text);
    const storage = found.filter((b) => b.space === "storage");
    assert.deepEqual(
      storage.map((b) => [b.name, b.access]),
      layout.bindings.map(([name, access]) => [name, access]),
      "storage bindings: names, order, access",
    );
    found.forEach((b, i) => {
      assert.equal(b.group, 0, `${b.name} is in group 0`);
      assert.equal(b.index, i, `${b.name} has binding ${i}`);
    });
    const last = found.at(-1);
    assert.ok(
      last && last.space === "uniform" && last.name === "params" && last.type === "Params",
      "the last binding is `params: Params` (uniform)",
    );
    assert.equal(found.length, layout.bindings.length + 1, "no bindings besides these");
    assert.deepEqual(paramsFields(text), layout.params.map(([n, t]) => [n, t]), "Params fields");
  });

  Deno.test(`${layout.file} opens with its contract block`, () => {
    const head = source(layout.file).split("\n").slice(0, 12).join("\n");
    const stem = layout.file.replace(/\.wgsl$/, "");
    assert.ok(head.startsWith(`// ${stem}: `), "first line names the kernel and its math");
    for (const word of ["Matches", "Bindings:", "Dispatch:", "Variants:"]) {
      assert.ok(head.includes(word), `the header states "${word}"`);
    }
  });
}
