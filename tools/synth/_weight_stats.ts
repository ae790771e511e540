// Test helpers for tools/synth: summary statistics of generated weight values.
// Used by generate_model_test.ts and weight_synth_test.ts.

/** Mean, population standard deviation, min and max of `v`. */
export function stats(v: Float32Array): { mean: number; std: number; min: number; max: number } {
  let s = 0, s2 = 0, min = Infinity, max = -Infinity;
  for (const x of v) {
    s += x;
    s2 += x * x;
    min = Math.min(min, x);
    max = Math.max(max, x);
  }
  const mean = s / v.length;
  return { mean, std: Math.sqrt(s2 / v.length - mean * mean), min, max };
}
