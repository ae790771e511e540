// Tests of the model generator: tensor sets and shapes per arch and layout (from docs/model_arch.md
// §3), weight types per scheme, value spreads, determinism, gguf-split output and full-size plans.

import assert from "node:assert/strict";
import { openGguf } from "../../engine/gguf/read.ts";
import type { GgufModel, GgufValue } from "../../engine/gguf/gguf_model.ts";
import { dequantize } from "../../engine/quant/dequant.ts";
import { GgmlType, typeName } from "../../engine/quant/ggml_types.ts";
import { generateModel, type ModelSpec, planModel } from "./generate_model.ts";
import { readHParams } from "../../engine/hparams.ts";
import { stats } from "./_weight_stats.ts";

const { F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K } = GgmlType;
const { IQ4_NL, IQ4_XS } = GgmlType;

/** The tiny preset's sizes, restated from the brief rather than read from presets.ts. */
const TINY = { D: 256, Hq: 4, Hkv: 2, Dh: 64, Nk: 2, Nv: 4, Dk: 64, Dv: 64, K: 4, E: 8 };
const TINY_FE = 256;
const TINY_FS = 256;
const TINY_F = 512;

/**
 * Expected tensors of a tiny model (docs/model_arch.md §3): name → shape. Blocks 0-2 are DeltaNet
 * and block 3 full attention (interval 4). V is the vocab size found in the file.
 */
function expectedTensors(
  arch: ModelSpec["arch"],
  layout: "split" | "legacy",
  V: number,
  tied = false,
): Map<string, number[]> {
  const { D, Hq, Hkv, Dh, Nk, Nv, Dk, Dv, K, E } = TINY;
  const C = 2 * Nk * Dk + Nv * Dv;
  const m = new Map<string, number[]>([["token_embd.weight", [D, V]]]);
  for (let i = 0; i < 4; i++) {
    const b = (s: string, shape: number[]) => m.set(`blk.${i}.${s}`, shape);
    b("attn_norm.weight", [D]);
    b("post_attention_norm.weight", [D]);
    if (i < 3) {
      if (layout === "legacy") b("ssm_in.weight", [D, 2 * Nk * Dk + 2 * Nv * Dv]);
      else {
        b("attn_qkv.weight", [D, C]);
        b("attn_gate.weight", [D, Nv * Dv]);
      }
      if (arch === "qwen3next") b("ssm_ba.weight", [D, 2 * Nv]);
      else {
        b("ssm_beta.weight", [D, Nv]);
        b("ssm_alpha.weight", [D, Nv]);
      }
      b("ssm_conv1d.weight", [K, C]);
      b("ssm_dt.bias", [Nv]);
      b("ssm_a", [Nv]);
      b("ssm_norm.weight", [Dv]);
      b("ssm_out.weight", [Nv * Dv, D]);
    } else {
      b("attn_q.weight", [D, 2 * Hq * Dh]);
      b("attn_k.weight", [D, Hkv * Dh]);
      b("attn_v.weight", [D, Hkv * Dh]);
      b("attn_q_norm.weight", [Dh]);
      b("attn_k_norm.weight", [Dh]);
      b("attn_output.weight", [Hq * Dh, D]);
    }
    if (arch === "qwen35") {
      b("ffn_gate.weight", [D, TINY_F]);
      b("ffn_up.weight", [D, TINY_F]);
      b("ffn_down.weight", [TINY_F, D]);
    } else {
      b("ffn_gate_inp.weight", [D, E]);
      b("ffn_gate_exps.weight", [D, TINY_FE, E]);
      b("ffn_up_exps.weight", [D, TINY_FE, E]);
      b("ffn_down_exps.weight", [TINY_FE, D, E]);
      b("ffn_gate_inp_shexp.weight", [D]);
      b("ffn_gate_shexp.weight", [D, TINY_FS]);
      b("ffn_up_shexp.weight", [D, TINY_FS]);
      b("ffn_down_shexp.weight", [TINY_FS, D]);
    }
  }
  m.set("output_norm.weight", [D]);
  if (!tied) m.set("output.weight", [D, V]);
  return m;
}

async function withModel<T>(
  spec: ModelSpec,
  use: (model: GgufModel, paths: string[]) => T | Promise<T>,
  split = 1,
): Promise<T> {
  const dir = await Deno.makeTempDir({ prefix: "tandem-gen-" });
  try {
    const paths = await generateModel(`${dir}/m.gguf`, spec, { split });
    const model = await openGguf(paths[0]);
    try {
      return await use(model, paths);
    } finally {
      model.close();
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

async function values(model: GgufModel, name: string): Promise<Float32Array> {
  const t = model.tensors.get(name)!;
  const n = t.shape.reduce((a, b) => a * b, 1);
  return dequantize(t.type, await model.readTensor(name), n);
}

const LAYOUTS: [ModelSpec["arch"], "split" | "legacy"][] = [
  ["qwen35moe", "split"],
  ["qwen35", "split"],
  ["qwen3next", "split"],
  ["qwen3next", "legacy"],
];

for (const [arch, layout] of LAYOUTS) {
  Deno.test(`tiny ${arch} (${layout}) f32 has the tensor set and hparams of its arch`, async () => {
    await withModel({ preset: "tiny", arch, layout }, (model) => {
      const tokens = model.metadata.get("tokenizer.ggml.tokens") as string[];
      const expected = expectedTensors(arch, layout, tokens.length);
      assert.deepEqual([...model.tensors.keys()].sort(), [...expected.keys()].sort());
      for (const [name, t] of model.tensors) {
        assert.deepEqual(t.shape, expected.get(name), name);
        assert.equal(t.type, F32, name);
      }
      const hp = readHParams(model.metadata);
      assert.deepEqual(hp.isDeltaNet, [true, true, true, false]);
      assert.equal(hp.nRot, 16);
      assert.equal(hp.ropeBase, 1e7);
      assert.deepEqual(hp.ropeSections, arch === "qwen3next" ? [] : [3, 3, 2, 0]);
      assert.equal(hp.E, arch === "qwen35" ? 0 : 8);
      assert.equal(hp.Ku, arch === "qwen35" ? 0 : 2);
      assert.equal(hp.Dv, 64);
      assert.equal(model.metadata.get(`${arch}.full_attention_interval`), 4);
      assert.equal(model.metadata.get(`${arch}.context_length`), 4096);
      if (arch !== "qwen3next") assert.equal(model.metadata.get(`${arch}.nextn_predict_layers`), 0);
      assert.equal(typeof model.metadata.get("tokenizer.chat_template"), "string");
    });
  });
}

Deno.test("tiny f32 values: stored norms near 1, ssm_a negative, projections ~N(0, 1/in)", async () => {
  await withModel({ preset: "tiny", arch: "qwen35moe" }, async (model) => {
    for (
      const name of [
        "blk.0.attn_norm.weight",
        "blk.1.post_attention_norm.weight",
        "blk.3.attn_q_norm.weight",
        "blk.3.attn_k_norm.weight",
        "blk.2.ssm_norm.weight",
        "output_norm.weight",
      ]
    ) {
      const s = stats(await values(model, name));
      assert.ok(Math.abs(s.mean - 1) < 0.05 && s.min > 0.5, `${name}: ${JSON.stringify(s)}`);
    }
    for (let i = 0; i < 3; i++) {
      const a = stats(await values(model, `blk.${i}.ssm_a`));
      assert.ok(a.max < 0, `ssm_a of block ${i} must be −exp(A_log) < 0: ${JSON.stringify(a)}`);
    }
    for (
      const [name, inDim] of [
        ["blk.0.attn_qkv.weight", 256],
        ["blk.3.attn_output.weight", 256],
        ["blk.1.ffn_down_exps.weight", 256],
        ["output.weight", 256],
      ] as const
    ) {
      const s = stats(await values(model, name));
      const want = 1 / Math.sqrt(inDim);
      assert.ok(Math.abs(s.mean) < 0.01 && Math.abs(s.std / want - 1) < 0.1, `${name}: ${s.std}`);
    }
    const embd = stats(await values(model, "token_embd.weight"));
    assert.ok(Math.abs(embd.std - 1) < 0.1, `token_embd std ${embd.std}`);
  });
});

Deno.test("the same spec gives the same bytes; another seed gives other weights", async () => {
  const spec: ModelSpec = { preset: "tiny", arch: "qwen3next", layout: "legacy", quant: "q8_0" };
  const read = (s: ModelSpec) => withModel(s, (_, [path]) => Deno.readFile(path));
  const [a, b, c] = [await read(spec), await read(spec), await read({ ...spec, seed: 2 })];
  assert.ok(a.length > 1_000_000);
  assert.deepEqual(a, b);
  assert.equal(a.length, c.length);
  assert.notDeepEqual(a, c);
});

Deno.test("worker threads write the same bytes as the calling thread", async () => {
  const spec: ModelSpec = { preset: "tiny", arch: "qwen35moe", quant: "q8_0", seed: 5 };
  const dir = await Deno.makeTempDir({ prefix: "tandem-gen-" });
  try {
    const [inline] = await generateModel(`${dir}/a.gguf`, spec, { workers: 0 });
    const [pooled] = await generateModel(`${dir}/b.gguf`, spec, { workers: 2 });
    assert.deepEqual(await Deno.readFile(pooled), await Deno.readFile(inline));
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("--split 3 writes 3 shards holding the same tensors and bytes as one file", async () => {
  const spec: ModelSpec = { preset: "tiny", arch: "qwen35moe", quant: "q8_0" };
  await withModel(spec, async (whole) => {
    await withModel(spec, async (split, paths) => {
      assert.equal(paths.length, 3);
      assert.match(paths[0], /-00001-of-00003\.gguf$/);
      assert.equal(split.shardPaths.length, 3);
      assert.deepEqual([...split.tensors.keys()], [...whole.tensors.keys()]);
      assert.equal(new Set([...split.tensors.values()].map((t) => t.shard)).size, 3);
      for (const [name, t] of whole.tensors) {
        const s = split.tensors.get(name)!;
        assert.deepEqual([s.shape, s.type], [t.shape, t.type], name);
        assert.deepEqual(await split.readTensor(name), await whole.readTensor(name), name);
      }
      assert.equal(split.metadata.get("general.architecture"), "qwen35moe");
    }, 3);
  });
});

Deno.test("tied models have no output.weight", async () => {
  await withModel({ preset: "tiny", arch: "qwen35", tied: true }, (model) => {
    const tokens = model.metadata.get("tokenizer.ggml.tokens") as string[];
    const expected = expectedTensors("qwen35", "split", tokens.length, true);
    assert.deepEqual([...model.tensors.keys()].sort(), [...expected.keys()].sort());
  });
});

Deno.test("an MTP block is one more full-attention block plus its four nextn tensors", async () => {
  await withModel({ preset: "tiny", arch: "qwen35moe", quant: "q8_0", mtp: true }, async (mtp) => {
    await withModel({ preset: "tiny", arch: "qwen35moe", quant: "q8_0" }, async (plain) => {
      const extra = [...mtp.tensors.keys()].filter((n) => !plain.tensors.has(n));
      const attention = [...plain.tensors.keys()].filter((n) => n.startsWith("blk.3."))
        .map((n) => n.replace("blk.3.", "blk.4."));
      const nextn = ["eh_proj", "enorm", "hnorm", "shared_head_norm"]
        .map((n) => `blk.4.nextn.${n}.weight`);
      assert.deepEqual(extra.sort(), [...attention, ...nextn].sort());
      assert.deepEqual(mtp.tensors.get("blk.4.nextn.eh_proj.weight")!.shape, [2 * TINY.D, TINY.D]);
      // The main stack keeps its bytes: every value depends only on the seed and the name.
      for (const name of plain.tensors.keys()) {
        assert.deepEqual(await mtp.readTensor(name), await plain.readTensor(name), name);
      }
      assert.equal(mtp.metadata.get("qwen35moe.block_count"), 5);
      assert.equal(mtp.metadata.get("qwen35moe.nextn_predict_layers"), 1);
      assert.equal(readHParams(mtp.metadata).nLayer, 4);
    });
  });
  assert.throws(
    () => planModel({ preset: "tiny", arch: "qwen3next", mtp: true }),
    /qwen3next model with an MTP block/,
  );
});

Deno.test("--layers deepens a preset: more blocks of the same widths, the first ones' bytes kept", async () => {
  await withModel({ preset: "tiny", arch: "qwen35moe", quant: "q8_0", layers: 9 }, async (deep) => {
    await withModel({ preset: "tiny", arch: "qwen35moe", quant: "q8_0" }, async (plain) => {
      const hp = readHParams(deep.metadata);
      assert.equal(hp.nLayer, 9);
      assert.equal(hp.D, TINY.D);
      // Every fourth block is full attention, as in the preset (interval 4): blocks 3 and 7.
      assert.deepEqual(
        [...Array(9).keys()].filter((i) => deep.tensors.has(`blk.${i}.attn_q.weight`)),
        [3, 7],
      );
      for (const name of plain.tensors.keys()) {
        assert.deepEqual(await deep.readTensor(name), await plain.readTensor(name), name);
      }
    });
  });
  for (const layers of [0, 1.5, 257]) {
    assert.throws(
      () => planModel({ preset: "tiny", arch: "qwen35moe", layers }),
      /Cannot plan a model of .* layers: expected a whole number from 1 to 256/,
    );
  }
});

Deno.test("q4_k_m and iq4_xs put the brief's types on each tensor class", () => {
  const types = (quant: "q4_k_m" | "iq4_xs") =>
    new Map(
      planModel({ preset: "tiny", arch: "qwen35moe", quant }).tensors.map((t) => [
        t.name,
        typeName(t.type),
      ]),
    );
  const k = types("q4_k_m");
  assert.equal(k.get("token_embd.weight"), "Q4_K");
  assert.equal(k.get("output.weight"), "Q6_K");
  assert.equal(k.get("blk.0.ffn_gate_exps.weight"), "Q4_K");
  assert.equal(k.get("blk.0.ffn_down_exps.weight"), "Q6_K");
  for (const n of ["blk.0.attn_qkv.weight", "blk.3.attn_q.weight", "blk.0.ssm_out.weight"]) {
    assert.ok(["Q5_K", "Q8_0", "Q6_K"].includes(k.get(n)!), n);
  }
  for (const n of ["blk.0.ffn_gate_inp.weight", "blk.0.ssm_conv1d.weight", "blk.0.ssm_a"]) {
    assert.equal(k.get(n), "F32", n);
  }
  const x = types("iq4_xs");
  for (const e of ["gate", "up", "down"]) {
    assert.equal(x.get(`blk.2.ffn_${e}_exps.weight`), "IQ4_XS");
    assert.equal(x.get(`blk.2.ffn_${e}_shexp.weight`), "Q8_0");
  }
  assert.equal(x.get("token_embd.weight"), "Q8_0");
  assert.equal(x.get("output.weight"), "Q6_K");
  assert.equal(x.get("blk.3.attn_k.weight"), "Q8_0");
  assert.equal(x.get("blk.1.attn_gate.weight"), "Q8_0");
});

Deno.test("mixed uses all 14 dequantizable types, and every tensor decodes near its spread", async () => {
  const wanted = [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS];
  await withModel({ preset: "tiny", arch: "qwen3next", quant: "mixed" }, async (model) => {
    const used = new Set([...model.tensors.values()].map((t) => t.type));
    for (const t of [...wanted, F16, BF16]) assert.ok(used.has(t), `${typeName(t)} unused`);
    for (const [name, t] of model.tensors) {
      if (t.shape.length === 1 || name.endsWith("ssm_conv1d.weight")) {
        assert.equal(t.type, F32, name);
        continue;
      }
      // Quantized N(0, σ²) keeps σ within the format's error; Q2_K/Q3_K are the coarsest.
      const s = stats(await values(model, name));
      const want = name === "token_embd.weight" ? 1 : 1 / Math.sqrt(t.shape[0]);
      assert.ok(Math.abs(s.std / want - 1) < 0.25, `${name} ${typeName(t.type)}: std ${s.std}`);
    }
  });
});

Deno.test("full-size plans match the published tensor counts and the bench model's size", () => {
  // docs/model_arch.md §3.6: 807 tensors (legacy) / 843 (split) for Qwen3-Next-80B; 753 for the 35B
  // with its MTP block, which is 16 attention-block tensors plus eh_proj, enorm, hnorm and
  // shared_head_norm.
  const next = (layout: "split" | "legacy") =>
    planModel({ preset: "qwen3next-80b", arch: "qwen3next", layout }).tensors.length;
  assert.equal(next("legacy"), 807);
  assert.equal(next("split"), 843);
  const bench = planModel({ preset: "qwen35moe-35b", arch: "qwen35moe", quant: "iq4_xs" });
  assert.equal(bench.tensors.length, 753 - 20);
  assert.equal(
    planModel({ preset: "qwen35moe-35b", arch: "qwen35moe", quant: "iq4_xs", mtp: true })
      .tensors.length,
    753,
  );
  // docs/PERFORMANCE.md ("The model"): the bench model of this shape and scheme is 19.66 GB.
  assert.ok(Math.abs(bench.dataBytes / 19.66e9 - 1) < 0.01, `${bench.dataBytes} bytes`);
  const hp = readHParams(new Map(bench.meta.map((e) => [e.key, e.value as GgufValue])));
  assert.deepEqual(
    [hp.nLayer, hp.D, hp.Hq, hp.Hkv, hp.Dh, hp.nRot, hp.Nk, hp.Nv, hp.Dk, hp.Dv, hp.E, hp.Ku],
    [40, 2048, 16, 2, 256, 64, 16, 32, 128, 128, 256, 8],
  );
  assert.equal(hp.V, 248320);
  assert.deepEqual(hp.ropeSections, [11, 11, 10, 0]);
});
