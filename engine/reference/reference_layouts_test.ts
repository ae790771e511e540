// Tensor-layout equivalences of the reference loader: one model re-laid out in memory as fused
// attn_qkv, merged gate_up_exps, qwen3next (V heads grouped, ssm_ba) and legacy ssm_in must
// give the same logits (engine/reference/reference_weights.ts and the pairing in deltanet.ts).

import assert from "node:assert/strict";
import { openGguf } from "../gguf/read.ts";
import type { GgufModel, GgufTensorInfo, GgufValue } from "../gguf/gguf_model.ts";
import { type HParams, readHParams } from "../hparams.ts";
import { dequantize } from "../quant/dequant.ts";
import { GgmlType } from "../quant/ggml_types.ts";
import { openReferenceStage } from "./reference_stage.ts";
import { testModel } from "../../tests/_models.ts";

/** A model held in memory as f32 tensors: shape (ne order) and values. */
interface Tensors {
  meta: Map<string, GgufValue>;
  data: Map<string, { shape: number[]; values: Float32Array }>;
}

async function loadAll(model: GgufModel): Promise<Tensors> {
  const data = new Map<string, { shape: number[]; values: Float32Array }>();
  for (const t of model.tensors.values()) {
    const n = t.shape.reduce((a, b) => a * b, 1);
    data.set(t.name, {
      shape: [...t.shape],
      values: dequantize(t.type, await model.readTensor(t.name), n),
    });
  }
  return { meta: new Map(model.metadata), data };
}

/** The GgufModel interface over in-memory f32 tensors. */
function memoryModel(path: string, m: Tensors): GgufModel {
  const bytes = new Map<string, Uint8Array>();
  const tensors = new Map<string, GgufTensorInfo>();
  for (const [name, { shape, values }] of m.data) {
    const b = new Uint8Array(values.buffer, values.byteOffset, values.byteLength);
    bytes.set(name, b);
    tensors.set(name, {
      name,
      shape,
      type: GgmlType.F32,
      nbytes: b.length,
      shard: 0,
      fileOffset: 0,
    });
  }
  const readTensorBytes = (
    name: string,
    start: number,
    length: number,
    into?: Uint8Array<ArrayBuffer>,
  ) => {
    const b = bytes.get(name);
    if (!b) return Promise.reject(new RangeError(`no tensor "${name}"`));
    const out = into ?? new Uint8Array(length);
    out.set(b.subarray(start, start + length));
    return Promise.resolve(out);
  };
  return {
    path,
    version: 3,
    shardPaths: [path],
    metadata: m.meta,
    metadataTypes: new Map(),
    tensors,
    readTensor: (name) => readTensorBytes(name, 0, bytes.get(name)?.length ?? 0),
    readTensorBytes,
    close() {},
  };
}

/** Rows `rows` (in order) of a row-major matrix with rows of `cols`. */
function rowsOf(values: Float32Array, cols: number, rows: readonly number[]): Float32Array {
  const out = new Float32Array(rows.length * cols);
  rows.forEach((r, i) => out.set(values.subarray(r * cols, (r + 1) * cols), i * cols));
  return out;
}

function range(from: number, count: number): number[] {
  return Array.from({ length: count }, (_, i) => from + i);
}

function take(m: Tensors, name: string): { shape: number[]; values: Float32Array } {
  const t = m.data.get(name);
  assert.ok(t, `tensor ${name}`);
  m.data.delete(name);
  return t;
}

/** Attention layers: attn_q, attn_k, attn_v → one attn_qkv with rows [q | k | v]. */
function fuseAttention(m: Tensors, hp: HParams): void {
  for (let il = 0; il < hp.nLayer; il++) {
    if (hp.isDeltaNet[il]) continue;
    const parts = ["attn_q", "attn_k", "attn_v"].map((n) => take(m, `blk.${il}.${n}.weight`));
    const values = new Float32Array(parts.reduce((a, p) => a + p.values.length, 0));
    let at = 0;
    for (const p of parts) {
      values.set(p.values, at);
      at += p.values.length;
    }
    m.data.set(`blk.${il}.attn_qkv.weight`, { shape: [hp.D, values.length / hp.D], values });
  }
}

/** ffn_gate_exps + ffn_up_exps → ffn_gate_up_exps, per expert [gate rows | up rows]. */
function mergeExperts(m: Tensors, hp: HParams): void {
  const { D, Fe, E } = hp;
  for (let il = 0; il < hp.nLayer; il++) {
    const gate = take(m, `blk.${il}.ffn_gate_exps.weight`).values;
    const up = take(m, `blk.${il}.ffn_up_exps.weight`).values;
    const values = new Float32Array(2 * E * Fe * D);
    for (let e = 0; e < E; e++) {
      values.set(gate.subarray(e * Fe * D, (e + 1) * Fe * D), 2 * e * Fe * D);
      values.set(up.subarray(e * Fe * D, (e + 1) * Fe * D), (2 * e + 1) * Fe * D);
    }
    m.data.set(`blk.${il}.ffn_gate_up_exps.weight`, { shape: [D, 2 * Fe, E], values });
  }
}

/**
 * qwen35moe → qwen3next: undo the converter's V-head reorder (docs/model_arch.md §3.7; GGUF slot
 * j·Nk + kh back to grouped kh·r + j) in every V-indexed tensor, pack b/a into ssm_ba per key head
 * [b (r) | a (r)], and rename the arch. With `reorder` false the V heads are left tiled, which
 * pairs them with the wrong key heads under qwen3next's ⌊h/r⌋.
 */
function asQwen3Next(m: Tensors, hp: HParams, reorder = true): void {
  const { D, Nk, Nv, Dk, Dv, Kc } = hp;
  const r = Nv / Nk;
  const keyDim = Nk * Dk;
  // New head g reads old head src[g].
  const src = range(0, Nv).map((g) => reorder ? (g % r) * Nk + Math.floor(g / r) : g);
  const headRows = (base: number, dim: number) => src.flatMap((h) => range(base + h * dim, dim));
  for (let il = 0; il < hp.nLayer; il++) {
    if (!hp.isDeltaNet[il]) continue;
    const p = `blk.${il}`;
    const qkv = take(m, `${p}.attn_qkv.weight`);
    qkv.values = rowsOf(qkv.values, D, [...range(0, 2 * keyDim), ...headRows(2 * keyDim, Dv)]);
    m.data.set(`${p}.attn_qkv.weight`, qkv);
    const gate = take(m, `${p}.attn_gate.weight`);
    gate.values = rowsOf(gate.values, D, headRows(0, Dv));
    m.data.set(`${p}.attn_gate.weight`, gate);
    const beta = rowsOf(take(m, `${p}.ssm_beta.weight`).values, D, src);
    const alpha = rowsOf(take(m, `${p}.ssm_alpha.weight`).values, D, src);
    const ba = new Float32Array(2 * Nv * D);
    for (let kh = 0; kh < Nk; kh++) {
      ba.set(beta.subarray(kh * r * D, (kh + 1) * r * D), 2 * kh * r * D);
      ba.set(alpha.subarray(kh * r * D, (kh + 1) * r * D), (2 * kh + 1) * r * D);
    }
    m.data.set(`${p}.ssm_ba.weight`, { shape: [D, 2 * Nv], values: ba });
    for (const name of [`${p}.ssm_a`, `${p}.ssm_dt.bias`]) {
      const t = take(m, name);
      m.data.set(name, { shape: t.shape, values: rowsOf(t.values, 1, src) });
    }
    const conv = take(m, `${p}.ssm_conv1d.weight`);
    conv.values = rowsOf(conv.values, Kc, [...range(0, 2 * keyDim), ...headRows(2 * keyDim, Dv)]);
    m.data.set(`${p}.ssm_conv1d.weight`, conv);
    // ssm_out's input columns: each of its D rows holds Nv·Dv values, permuted per head.
    const out = take(m, `${p}.ssm_out.weight`);
    const cols = Nv * Dv;
    const permuted = new Float32Array(out.values.length);
    for (let row = 0; row < D; row++) {
      permuted.set(
        rowsOf(out.values.subarray(row * cols, (row + 1) * cols), 1, headRows(0, Dv)),
        row * cols,
      );
    }
    m.data.set(`${p}.ssm_out.weight`, { shape: out.shape, values: permuted });
  }
  for (const [key, value] of [...m.meta]) {
    if (!key.startsWith(`${hp.arch}.`)) continue;
    m.meta.delete(key);
    m.meta.set(`qwen3next.${key.slice(hp.arch.length + 1)}`, value);
  }
  m.meta.set("general.architecture", "qwen3next");
}

/** qwen3next attn_qkv + attn_gate → legacy ssm_in, per key head [q | k | v (r·Dv) | z (r·Dv)]. */
function asLegacy(m: Tensors, hp: HParams): void {
  const { D, Nk, Nv, Dk, Dv } = hp;
  const r = Nv / Nk;
  const keyDim = Nk * Dk;
  for (let il = 0; il < hp.nLayer; il++) {
    if (!hp.isDeltaNet[il]) continue;
    const p = `blk.${il}`;
    const qkv = take(m, `${p}.attn_qkv.weight`).values;
    const z = take(m, `${p}.attn_gate.weight`).values;
    const groups = range(0, Nk).map((kh) => [
      rowsOf(qkv, D, range(kh * Dk, Dk)),
      rowsOf(qkv, D, range(keyDim + kh * Dk, Dk)),
      rowsOf(qkv, D, range(2 * keyDim + kh * r * Dv, r * Dv)),
      rowsOf(z, D, range(kh * r * Dv, r * Dv)),
    ]).flat();
    const values = new Float32Array(groups.reduce((a, g) => a + g.length, 0));
    let at = 0;
    for (const g of groups) {
      values.set(g, at);
      at += g.length;
    }
    m.data.set(`${p}.ssm_in.weight`, { shape: [D, values.length / D], values });
  }
}

async function logitsOf(model: GgufModel, ids: Uint32Array): Promise<Float32Array> {
  const nLayer = readHParams(model.metadata).nLayer;
  const stage = await openReferenceStage(model, { first: 0, end: nLayer, slots: 1, ctx: 32 });
  return await stage.logits(0, { kind: "ids", ids }, ids.length, 0);
}

function maxDiff(a: Float32Array, b: Float32Array): number {
  assert.equal(a.length, b.length);
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i] - b[i]));
  return m;
}

Deno.test("reference layouts: a qwen35moe model fused, merged, as qwen3next and as legacy gives the same logits", async () => {
  const file = await openGguf(await testModel({ arch: "qwen35moe" }));
  const base = await loadAll(file);
  file.close();
  const hp = readHParams(base.meta);
  const ids = Uint32Array.from({ length: 10 }, (_, i) => (i * 331 + 7) % hp.V);
  const expected = await logitsOf(memoryModel("base", base), ids);

  // Row-only permutations: bit-identical.
  const fused = await loadAll(memoryModel("base", base));
  fuseAttention(fused, hp);
  mergeExperts(fused, hp);
  assert.deepEqual(await logitsOf(memoryModel("fused+merged", fused), ids), expected);

  // qwen3next: the same function with grouped V heads, interleaved pairing and ssm_ba. Permuting
  // ssm_out's columns reorders its float64 sums, so equality holds to rounding, not to the bit.
  const next = await loadAll(memoryModel("base", base));
  asQwen3Next(next, hp);
  const nextLogits = await logitsOf(memoryModel("qwen3next", next), ids);
  assert.ok(
    maxDiff(nextLogits, expected) < 1e-5,
    `qwen3next differs by ${maxDiff(nextLogits, expected)}`,
  );

  // Its legacy ssm_in layout is again a row permutation of the split one: bit-identical.
  const nextHp = readHParams(next.meta);
  asLegacy(next, nextHp);
  assert.deepEqual(await logitsOf(memoryModel("qwen3next legacy", next), ids), nextLogits);

  // Without the V-head reorder, qwen3next pairs heads differently: clearly different logits.
  const wrong = await loadAll(memoryModel("base", base));
  asQwen3Next(wrong, hp, false);
  const wrongDiff = maxDiff(await logitsOf(memoryModel("unordered", wrong), ids), expected);
  assert.ok(wrongDiff > 1e-2, `pairing made no difference (${wrongDiff})`);
});
