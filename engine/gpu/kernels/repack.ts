// Weight rows from the GGUF file's layout into the GPU's (wgsl/repack.wgsl), for the types
// engine/gpu/weight_layout.ts lays out anew: run by engine/gpu/tensor.ts once a part at upload.

import { GgmlType, rowBytes, typeName } from "../../quant/ggml_types.ts";
import type { GpuContext } from "../device.ts";
import { type KernelFamily, loaderKernel, packParams, PARAMS_SLOT_BYTES } from "../kernel.ts";
import { gpuRowBytes, isRepacked } from "../weight_layout.ts";

const WG = 256;
const MAX_GROUPS_X = 65535;

/** A variant per repacked type. */
export const REPACK: KernelFamily<GgmlType> = {
  file: "repack.wgsl",
  variant: (_, type) => {
    if (!isRepacked(type)) {
      throw new TypeError(`Cannot repack ${typeName(type)} rows: the GPU keeps them as stored`);
    }
    return { name: `repack_${typeName(type)}`, defines: { [`TYPE_${typeName(type)}`]: true } };
  },
};

/**
 * Submits the repack of `rows` rows of `cols` values of `type` from `src` (the file's bytes from
 * 0, 4 bytes of padding after) into `dst` (gpuRowBytes a row). `src` may be destroyed once this
 * returns: the queue keeps it until the work is done.
 */
export function repackRows(
  ctx: GpuContext,
  type: GgmlType,
  cols: number,
  rows: number,
  src: GPUBuffer,
  dst: GPUBuffer,
): void {
  const kernel = loaderKernel(ctx, REPACK, type);
  const rowWords = gpuRowBytes(type, cols) / 4;
  const params = ctx.device.createBuffer({
    label: `${kernel.name} params`,
    size: PARAMS_SLOT_BYTES,
    usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST,
  });
  const values = new ArrayBuffer(PARAMS_SLOT_BYTES);
  packParams(
    kernel,
    {
      rows,
      k: cols,
      src_row_bytes: rowBytes(type, cols),
      row_words: rowWords,
    },
    new DataView(values),
    0,
  );
  ctx.device.queue.writeBuffer(params, 0, values);
  const group = ctx.device.createBindGroup({
    label: kernel.name,
    layout: kernel.bindGroupLayout,
    entries: [src, dst, params].map((buffer, binding) => ({ binding, resource: { buffer } })),
  });
  const groups = Math.ceil((rows * rowWords) / WG);
  const x = Math.min(groups, MAX_GROUPS_X);
  const enc = ctx.device.createCommandEncoder({ label: kernel.name });
  const pass = enc.beginComputePass();
  pass.setPipeline(kernel.pipeline);
  pass.setBindGroup(0, group);
  pass.dispatchWorkgroups(x, Math.ceil(groups / x));
  pass.end();
  ctx.device.queue.submit([enc.finish()]);
  params.destroy();
}
