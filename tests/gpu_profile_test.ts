// Checks bench/profile.ts and the DispatchProfiler under it on a tiny qwen35moe model: the table
// covers every dispatched kernel, counts match, times fit the span, N sequences share each step.

import assert from "node:assert/strict";
import type { GpuContext } from "../engine/gpu/device.ts";
import { builtKernel } from "../engine/gpu/kernel.ts";
import { gpuTest } from "./_gpu.ts";
import { withModel } from "./_stage_gates.ts";
import { formatSteps, kernelRows, profileModel, type StepReport } from "../bench/profile.ts";
import { EXPERT_MATVEC_MAX_TOKENS } from "../engine/gpu/kernels/mul_mat.ts";

/**
 * Families every qwen35moe step dispatches (DeltaNet and attention layers, MoE, the head);
 * one-token steps fold rms_norm, ssm_conv and moe_sum into their products.
 */
const FAMILIES = [
  "get_rows",
  "mul_mat",
  "gated_delta_net",
  "qk_norm_rope",
  "attention",
  "moe_route",
  "argmax",
];

function checkStep(
  gpuCtx: GpuContext,
  step: StepReport,
  what: string,
  families: readonly string[],
): void {
  const gpu = step.gpu;
  if (!gpu) throw new Error(`${what}: a device with timestamp-query timed no dispatch`);
  assert.equal(gpu.dispatches.length, step.dispatches, `${what}: timed vs encoded dispatches`);
  const rows = kernelRows([gpu]);
  assert.equal(rows.reduce((s, r) => s + r.dispatches, 0), step.dispatches, `${what}: counts`);
  for (const d of gpu.dispatches) {
    assert.ok(
      d.startNs >= 0 && d.endNs >= d.startNs,
      `${what}: ${d.kernel} ${d.startNs}..${d.endNs}`,
    );
    assert.ok(d.endNs <= gpu.spanNs, `${what}: ${d.kernel} ends after the step's span`);
  }
  const names = new Set(gpu.dispatches.map((d) => d.kernel));
  assert.deepEqual(new Set(rows.map((r) => r.kernel)), names, `${what}: table kernels`);
  for (const r of rows) {
    builtKernel(gpuCtx, r.kernel);
    const want: number = gpu.dispatches.filter((d) => d.kernel === r.kernel).length;
    assert.equal(r.dispatches, want, `${what}: ${r.kernel} count`);
    assert.ok(r.ns >= 0, `${what}: ${r.kernel} time ${r.ns}`);
  }
  for (const f of families) {
    assert.ok(rows.some((r) => r.kernel.startsWith(f)), `${what}: no ${f} kernel in the table`);
  }
  const busy = rows.reduce((s, r) => s + r.ns, 0);
  assert.ok(busy <= gpu.spanNs, `${what}: busy ${busy} ns exceeds the span ${gpu.spanNs} ns`);
  assert.ok(step.wallMs * 1e6 >= gpu.spanNs, `${what}: the wall time is shorter than the GPU span`);
}

gpuTest("bench/profile: per-kernel GPU times of a prefill chunk and decode steps", async (gpu) => {
  await withModel({ arch: "qwen35moe" }, async (model) => {
    // Past the decode products' most tokens: the experts gathered, their sum a kernel of its own.
    const prefill = EXPERT_MATVEC_MAX_TOKENS + 6;
    const report = await profileModel(model, gpu, { prefill, decode: 2 });
    assert.equal(report.prefill.tokens, prefill);
    assert.deepEqual(report.decode.map((s) => s.tokens), [1, 1]);
    if (!gpu.features.timestamps) {
      assert.ok(report.prefill.gpu === undefined);
      assert.match(formatSteps("prefill", [report.prefill]), /wall times only/);
      return;
    }
    checkStep(gpu, report.prefill, "prefill", [...FAMILIES, "rms_norm", "ssm_conv", "moe_sum"]);
    report.decode.forEach((s, i) => checkStep(gpu, s, `decode ${i}`, FAMILIES));
    const table = formatSteps("decode", report.decode);
    const decodeRows = kernelRows(report.decode.map((s) => s.gpu!));
    for (const folded of ["rms_norm", "ssm_conv", "moe_sum"]) {
      const left = decodeRows.find((r) => r.kernel.startsWith(folded));
      assert.equal(left, undefined, `a decode step dispatches ${folded} on its own`);
    }
    for (const r of decodeRows) {
      assert.match(table, new RegExp(`\\n  ${r.kernel} +${r.dispatches / 2} `), r.kernel);
    }
  });
});

gpuTest("bench/profile: decode steps of several sampled sequences, a row of each", async (gpu) => {
  await withModel({ arch: "qwen35moe" }, async (model) => {
    const report = await profileModel(model, gpu, { prefill: 3, at: 5, decode: 2, sequences: 2 });
    // The chunk after the 5 positions before it, not theirs.
    assert.equal(report.prefill.tokens, 3);
    // One step per decode step, each carrying both sequences' rows (not a step per sequence).
    assert.deepEqual(report.decode.map((s) => s.tokens), [2, 2]);
    for (const s of report.decode) assert.ok(s.wallMs >= s.encodeMs, "wall covers encoding");
    assert.match(formatSteps("decode", report.decode), /decode: 2 runs of 2 token\(s\)/);
    if (!gpu.features.timestamps) return;
    // Sampled: each step returns every sequence's top-k.
    report.decode.forEach((s, i) => checkStep(gpu, s, `decode ${i}`, [...FAMILIES, "topk"]));
  });
});

Deno.test("bench/profile: a step without timestamps prints its wall time only", () => {
  const text = formatSteps("decode", [{ tokens: 1, dispatches: 50, wallMs: 2.5, encodeMs: 0.5 }]);
  assert.match(text, /wall 2\.500 ms, encode 0\.500 ms, 50 dispatches/);
  assert.match(text, /no timestamp-query/);
  assert.doesNotMatch(text, /kernel/);
});
