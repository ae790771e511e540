// Row normalisations of the hybrid block: RMSNorm, per-head L2 norm, gated RMSNorm.
// Called by engine/reference/reference_forward.ts; the GPU norm kernels are tested against these.

import { silu, type Vec } from "./math.ts";

/**
 * RMSNorm of each row of `w.length` values: x·(1/√(mean(x²)+ε))·w (docs/model_arch.md §4.2). A
 * vector of several rows (e.g. all heads of q with the shared q-norm weight) is normalised row by
 * row. The weight is used as stored: the GGUF already holds 1+w for the zero-centred norms.
 */
export function rmsNorm(x: Vec, w: Vec, eps: number): Float64Array {
  const n = w.length;
  checkRows(x.length, n, "RMSNorm");
  const y = new Float64Array(x.length);
  for (let off = 0; off < x.length; off += n) {
    let sum = 0;
    for (let i = 0; i < n; i++) sum += x[off + i] * x[off + i];
    const scale = 1 / Math.sqrt(sum / n + eps);
    for (let i = 0; i < n; i++) y[off + i] = x[off + i] * scale * w[i];
  }
  return y;
}

/**
 * L2 normalisation of each head of `headDim` values: x / max(‖x‖₂, ε), as
 * `ggml_compute_forward_l2_norm_f32` (docs/model_arch.md §4.6.4); ε is the model's RMS epsilon.
 */
export function l2NormHeads(x: Vec, headDim: number, eps: number): Float64Array {
  checkRows(x.length, headDim, "L2 norm");
  const y = new Float64Array(x.length);
  for (let off = 0; off < x.length; off += headDim) {
    let sum = 0;
    for (let i = 0; i < headDim; i++) sum += x[off + i] * x[off + i];
    const scale = 1 / Math.max(Math.sqrt(sum), eps);
    for (let i = 0; i < headDim; i++) y[off + i] = x[off + i] * scale;
  }
  return y;
}

/**
 * DeltaNet output norm per value head of `w.length` values: RMSNorm(o)·w·silu(z)
 * (docs/model_arch.md §4.6.7). z is the raw gate projection and is not normalised; the weight
 * (ssm_norm) has no +1 baked in.
 */
export function gatedRmsNorm(o: Vec, z: Vec, w: Vec, eps: number): Float64Array {
  if (z.length !== o.length) {
    throw new RangeError(`Cannot gate ${o.length} values with ${z.length} gate values`);
  }
  const y = rmsNorm(o, w, eps);
  for (let i = 0; i < y.length; i++) y[i] *= silu(z[i]);
  return y;
}

function checkRows(length: number, n: number, what: string): void {
  if (n <= 0 || length % n !== 0) {
    throw new RangeError(
      `Cannot apply ${what} to ${length} values: not a whole number of rows of ${n}`,
    );
  }
}
