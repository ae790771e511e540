// Hand-made HParams of one DeltaNet layer for the op tests, without a model file.
// Used by engine/reference/reference_ops_test.ts (CPU) and tests/gpu_deltanet_test.ts (WGSL) alike.

import type { Arch, HParams } from "../engine/hparams.ts";

/** One DeltaNet layer of Nk key heads, Nv value heads and head sizes Dk, Dv; the rest minimal. */
export function deltaNetHParams(
  arch: Arch,
  Nk: number,
  Nv: number,
  Dk: number,
  Dv: number,
): HParams {
  return {
    arch,
    nLayer: 1,
    D: 4,
    Hq: 1,
    Hkv: 1,
    Dh: 4,
    nRot: 4,
    ropeBase: 1e7,
    ropeSections: [],
    eps: 1e-6,
    Kc: 4,
    Nk,
    Nv,
    Dk,
    Dv,
    C: 2 * Nk * Dk + Nv * Dv,
    E: 0,
    Ku: 0,
    Fe: 0,
    Fs: 0,
    F: 4,
    V: 8,
    isDeltaNet: [true],
  };
}
