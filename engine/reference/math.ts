// Scalar activations and the matrix-vector product under every CPU reference op.
// Leaf of engine/reference: norms, attention, deltanet, ffn and forward all build on it.

/** Any dense float vector an op accepts. Ops compute in float64 and return Float64Array. */
export type Vec = Float16Array | Float32Array | Float64Array;

/** 1/(1+e^−x) (docs/model_arch.md §4.3). */
export function sigmoid(x: number): number {
  return 1 / (1 + Math.exp(-x));
}

/** x·sigmoid(x). */
export function silu(x: number): number {
  return x / (1 + Math.exp(-x));
}

/** ln(1+e^x), and x itself above 20 as `ggml_compute_softplus_f32` does. */
export function softplus(x: number): number {
  return x > 20 ? x : Math.log1p(Math.exp(x));
}

/**
 * y = W·x for a row-major weight of `W.length / x.length` rows of `x.length` values (a GGUF
 * `{in, out}` tensor dequantized). Each row is one float64 sum in index order.
 */
export function matVec(w: Vec, x: Vec): Float64Array {
  const cols = x.length;
  const rows = w.length / cols;
  if (!Number.isInteger(rows)) {
    throw new RangeError(
      `Cannot multiply a weight of ${w.length} values by a vector of ${cols}: not a whole number of rows`,
    );
  }
  const y = new Float64Array(rows);
  for (let r = 0; r < rows; r++) {
    const off = r * cols;
    let s = 0;
    for (let i = 0; i < cols; i++) s += w[off + i] * x[i];
    y[r] = s;
  }
  return y;
}
