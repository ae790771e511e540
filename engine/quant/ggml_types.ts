// ggml tensor types: ids as stored in GGUF, and the block geometry of each.
// Shared by the GGUF reader (sizes), the CPU dequantizers and the GPU weight loader.

/** ggml type ids (gguf-py `constants.py`). Only those with a block geometry below are readable. */
export enum GgmlType {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ4_NL = 20,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  BF16 = 30,
}

/** Elements per block and bytes per block. */
export interface BlockGeometry {
  readonly blockSize: number;
  readonly typeSize: number;
}

const GEOMETRY: ReadonlyMap<GgmlType, BlockGeometry> = new Map([
  [GgmlType.F32, { blockSize: 1, typeSize: 4 }],
  [GgmlType.F16, { blockSize: 1, typeSize: 2 }],
  [GgmlType.BF16, { blockSize: 1, typeSize: 2 }],
  [GgmlType.F64, { blockSize: 1, typeSize: 8 }],
  [GgmlType.I8, { blockSize: 1, typeSize: 1 }],
  [GgmlType.I16, { blockSize: 1, typeSize: 2 }],
  [GgmlType.I32, { blockSize: 1, typeSize: 4 }],
  [GgmlType.I64, { blockSize: 1, typeSize: 8 }],
  [GgmlType.Q4_0, { blockSize: 32, typeSize: 18 }],
  [GgmlType.Q4_1, { blockSize: 32, typeSize: 20 }],
  [GgmlType.Q5_0, { blockSize: 32, typeSize: 22 }],
  [GgmlType.Q5_1, { blockSize: 32, typeSize: 24 }],
  [GgmlType.Q8_0, { blockSize: 32, typeSize: 34 }],
  [GgmlType.Q8_1, { blockSize: 32, typeSize: 36 }],
  [GgmlType.IQ4_NL, { blockSize: 32, typeSize: 18 }],
  [GgmlType.Q2_K, { blockSize: 256, typeSize: 84 }],
  [GgmlType.Q3_K, { blockSize: 256, typeSize: 110 }],
  [GgmlType.Q4_K, { blockSize: 256, typeSize: 144 }],
  [GgmlType.Q5_K, { blockSize: 256, typeSize: 176 }],
  [GgmlType.Q6_K, { blockSize: 256, typeSize: 210 }],
  [GgmlType.Q8_K, { blockSize: 256, typeSize: 292 }],
  [GgmlType.IQ4_XS, { blockSize: 256, typeSize: 136 }],
]);

/** Block geometry of a type, or undefined for a type id this project cannot read. */
export function blockGeometry(type: number): BlockGeometry | undefined {
  return GEOMETRY.get(type as GgmlType);
}

/** The name llama.cpp prints for a type id ("Q4_K"), or "type 99" for an unknown one. */
export function typeName(type: number): string {
  return GgmlType[type] ?? `type ${type}`;
}

/** Bytes taken by `n` elements of `type` in one row; `n` must be a whole number of blocks. */
export function rowBytes(type: GgmlType, n: number): number {
  const g = GEOMETRY.get(type);
  if (!g) throw new TypeError(`Cannot size a row of ${typeName(type)}: the type is not supported`);
  if (n % g.blockSize !== 0) {
    throw new RangeError(
      `Cannot size a row of ${n} ${
        typeName(type)
      } values: not a multiple of the block size ${g.blockSize}`,
    );
  }
  return (n / g.blockSize) * g.typeSize;
}
