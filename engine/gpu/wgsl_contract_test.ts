// Checks the WGSL side of every kernel without a GPU: each wgsl/<op>.wgsl has one binder,
// engine/gpu/kernels/<op>.ts, exporting its KernelFamily; every listed variant expands, its
// interface parses (group 0, bindings in order, storage first, `params: Params` last), it has one
// `@compute fn main`, keeps the bindings of the file's other variants and has a name of its own;
// every file opens with its contract block. Dispatch names are checked against the parsed
// interface by orderBindings/packParams (tested here), which every GPU test runs.

import assert from "node:assert/strict";
import {
  type KernelFamily,
  type KernelInterface,
  type KernelTarget,
  orderBindings,
  packParams,
  PARAMS_SLOT_BYTES,
  variantSource,
} from "./kernel.ts";
import { ATTENTION } from "./kernels/attention.ts";
import { ATTENTION_COMBINE } from "./kernels/attention_combine.ts";
import { GATED_DELTA_NET } from "./kernels/gated_delta_net.ts";
import { GET_ROWS } from "./kernels/get_rows.ts";
import { MMA_INPUT } from "./kernels/mma_input.ts";
import { MOE_GATHER } from "./kernels/moe_gather.ts";
import { MUL_MAT, MUL_MAT_TYPES } from "./kernels/mul_mat.ts";
import {
  type MmaPrecision,
  mmaStagesF32,
  mmaTakes,
  type MmaTile,
  mmaWorkgroupBytes,
  MUL_MAT_MMA,
} from "./kernels/mul_mat_mma.ts";
import { MUL_MAT_VEC, type MulMatVecKey, workgroupBytes } from "./kernels/mul_mat_vec.ts";
import { REPACK } from "./kernels/repack.ts";
import { GgmlType } from "../quant/ggml_types.ts";
import { RMS_NORM } from "./kernels/rms_norm.ts";
import { TOPK } from "./kernels/topk.ts";

const WGSL = new URL("../../wgsl/", import.meta.url);
const KERNELS = new URL("./kernels/", import.meta.url);

function stems(dir: URL, ext: string): string[] {
  return [...Deno.readDirSync(dir)]
    .filter((e) => e.isFile && e.name.endsWith(ext) && !e.name.endsWith(`_test${ext}`))
    .map((e) => e.name.slice(0, -ext.length))
    .sort();
}

function isFamily(v: unknown): v is KernelFamily<unknown> {
  return typeof v === "object" && v !== null && "file" in v && "variant" in v;
}

/**
 * Devices the variants are built for: with and without subgroups, small and large groups, the
 * WebGPU default of workgroup memory and an H200's.
 */
const TARGETS = [true, false].map((subgroups): KernelTarget => ({
  features: { subgroups, f16: subgroups, timestamps: false, subgroupMatrix: subgroups },
  limits: {
    maxBufferSize: 2 ** 30,
    maxStorageBufferBindingSize: 2 ** 30,
    maxComputeWorkgroupStorageSize: subgroups ? 49152 : 16384,
    maxComputeInvocationsPerWorkgroup: subgroups ? 1024 : 256,
    maxComputeWorkgroupsPerDimension: 65535,
    minUniformBufferOffsetAlignment: 256,
    minStorageBufferOffsetAlignment: 256,
    maxStorageBuffersPerShaderStage: 8,
    subgroupMinSize: subgroups ? 32 : 0,
  },
}));

/** Every tensor-core tile shape, staged in one buffer and in two. */
const MMA_TILES: readonly MmaTile[] = ([64, 128] as const).flatMap((rows) =>
  ([32, 64, 128] as const).flatMap((tokens) =>
    ([1, 2] as const).map((stages) => ({ rows, tokens, stages }))
  )
);

/** Keys beyond the one key of single-variant families (key type `void`), per target. */
const KEYS = new Map<string, readonly unknown[] | ((t: KernelTarget) => readonly unknown[])>([
  [
    MUL_MAT.file,
    (t) =>
      MUL_MAT_TYPES.flatMap((type) => [
        { type },
        { type, add: true },
        { type, swiglu: true, add: true },
        { type, id: true },
        { type, id: true, swiglu: true },
        { type, prefetch: true, tile: { rows: 64, tokens: 32 } },
        { type, prefetch: true, tile: { rows: 64, tokens: 32 }, pad: false },
        ...(t.limits.maxComputeWorkgroupStorageSize < 24576 + 64 ? [] : [
          { type, prefetch: true, tile: { rows: 128, tokens: 64 } },
          { type, id: true, prefetch: true, tile: { rows: 128, tokens: 32 } },
        ]),
      ]),
  ],
  [
    MUL_MAT_VEC.file,
    (t) =>
      MUL_MAT_TYPES.flatMap((type) =>
        ([
          { wg: 128, cu: 16, rpt: 1, xstage: true },
          { wg: 256, cu: 32, rpt: 2, xstage: false },
          { wg: 128, cu: 64, rpt: 4, xstage: true },
        ] as const).flatMap((layout): MulMatVecKey[] => [
          { type, layout },
          { type, layout, norm: true },
          { type, layout, swiglu: true, add: true },
          { type, layout, id: true, norm: true },
          { type, layout, id: true, swiglu: true },
          ...(layout.cu !== 16 ? [] : [
            { type, layout, norm: true, tokens: 2 },
            { type, layout, add: true, tokens: 4 },
            { type, layout, swiglu: true, tokens: 8 },
            { type, layout, id: true, gathered: true, swiglu: true, tokens: 4 },
          ] as const),
        ])
      ).filter((key) => workgroupBytes(key) <= t.limits.maxComputeWorkgroupStorageSize),
  ],
  [
    MUL_MAT_MMA.file,
    (t) => {
      const fits = (tile: MmaTile, emulate: boolean, precision?: MmaPrecision) =>
        mmaWorkgroupBytes(tile, mmaStagesF32(t, emulate), precision) <=
          t.limits.maxComputeWorkgroupStorageSize;
      return MMA_TILES.flatMap((tile) =>
        MUL_MAT_TYPES.filter(mmaTakes).flatMap((type) => [
          ...(fits(tile, false)
            ? [
              { type, tile },
              { type, tile, prefetch: true, add: true },
              { type, tile, prefetch: true, id: true },
            ]
            : []),
          ...(fits(tile, true) ? [{ type, tile, prefetch: true, id: true, emulate: true }] : []),
          ...(fits(tile, false, "f16")
            ? [{ type, tile, precision: "f16" as const, prefetch: true, add: true }]
            : []),
        ])
      );
    },
  ],
  [
    MMA_INPUT.file,
    [false, true].flatMap((swiglu) => [false, true].map((split) => ({ swiglu, split }))),
  ],
  [GET_ROWS.file, MUL_MAT_TYPES],
  [REPACK.file, [GgmlType.Q8_0, GgmlType.Q6_K]],
  [MOE_GATHER.file, ["count", "scan", "place"]],
  [TOPK.file, [false, true]],
  [ATTENTION.file, [64, 128, 256].flatMap((dh) => [1, 4, 8].map((tq) => ({ dh, tq })))],
  [ATTENTION_COMBINE.file, [64, 256].map((dh) => ({ dh, block: 64 }))],
  [
    GATED_DELTA_NET.file,
    [{ dk: 64, dv: 64 }, { dk: 128, dv: 128 }].flatMap((shape) =>
      (["fused", "split", "norm"] as const).map((pass) => ({ ...shape, pass }))
    ),
  ],
]);

const families = new Map<string, KernelFamily<unknown>>();
for (const stem of stems(KERNELS, ".ts")) {
  const module: Record<string, unknown> = await import(new URL(`${stem}.ts`, KERNELS).href);
  const own = Object.values(module).filter(isFamily);
  assert.equal(own.length, 1, `engine/gpu/kernels/${stem}.ts exports one KernelFamily`);
  families.set(stem, own[0]);
}

Deno.test("every kernel in wgsl/ has one binder of the same name, and every binder a kernel", () => {
  assert.deepEqual([...families.keys()], stems(WGSL, ".wgsl"));
  for (const [stem, family] of families) assert.equal(family.file, `${stem}.wgsl`);
});

for (const [stem, family] of families) {
  Deno.test(`${family.file}: every variant parses, binds as the others and has its own name`, () => {
    const perTarget = KEYS.get(family.file) ?? [undefined];
    let first: KernelInterface["bindings"] | undefined;
    const names = new Map<string, string>();
    for (const target of TARGETS) {
      for (const key of typeof perTarget === "function" ? perTarget(target) : perTarget) {
        const v = family.variant(target, key);
        const { code, iface } = variantSource(family, v);
        assert.equal(code.match(/@compute[^{]*\bfn main\(/g)?.length, 1, `${v.name}: one main`);
        first ??= iface.bindings;
        assert.deepEqual(iface.bindings, first, `${v.name}: bindings as the other variants`);
        const defines = JSON.stringify(v.defines);
        assert.ok(v.name.startsWith(stem), `${v.name} starts with ${stem}`);
        assert.ok(
          (names.get(v.name) ?? defines) === defines,
          `${v.name} names two define sets`,
        );
        names.set(v.name, defines);
      }
    }
  });

  Deno.test(`${family.file} opens with its contract block`, () => {
    const lines = Deno.readTextFileSync(new URL(family.file, WGSL)).split("\n");
    const head = lines.slice(0, lines.findIndex((l) => !l.startsWith("//"))).join("\n");
    assert.ok(head.startsWith(`// ${stem}: `), "first line names the kernel and its math");
    for (const word of ["Matches", "Bindings:", "Dispatch:", "Variants:"]) {
      assert.ok(head.includes(word), `the header states "${word}"`);
    }
  });
}

Deno.test("orderBindings() and packParams() take exactly the names the WGSL declares", () => {
  const v = RMS_NORM.variant(TARGETS[0], undefined);
  const kernel = { name: v.name, file: RMS_NORM.file, iface: variantSource(RMS_NORM, v).iface };
  assert.deepEqual(orderBindings(kernel, { y: "Y", w: "W", x: "X" }), ["X", "W", "Y"]);
  assert.throws(() => orderBindings(kernel, { x: "X", w: "W" }), /buffer "y" is missing/);
  assert.throws(
    () => orderBindings(kernel, { x: "X", w: "W", y: "Y", z: "Z" }),
    /rms_norm.wgsl has no binding z/,
  );
  const view = new DataView(new ArrayBuffer(PARAMS_SLOT_BYTES));
  const params = { eps: 0.5, n: 7, rows: 2, x_offset: 1, x_stride: 9, y_offset: 3, y_stride: 8 };
  packParams(kernel, params, view, 0);
  assert.deepEqual([...new Uint32Array(view.buffer, 0, 6)], [7, 2, 1, 9, 3, 8]);
  assert.equal(view.getFloat32(24, true), 0.5);
  assert.throws(() => packParams(kernel, { ...params, eps: NaN }, view, 0), /"eps" is NaN/);
  assert.throws(() => packParams(kernel, { ...params, tokens: 1 }, view, 0), /has no tokens/);
});
