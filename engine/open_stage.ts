// Opens the local stage of this process on the chosen backend (GPU engine or CPU reference).
// The one switch point between engines; generate, worker and head all open stages here.

import type { GgufModel } from "./gguf/gguf_model.ts";
import { PROVIDER_CHOICES, type ProviderChoice } from "./gpu/provider.ts";
import { readHParams } from "./hparams.ts";
import { openReferenceStage } from "./reference/reference_stage.ts";
import type { Stage } from "./stage.ts";

export type Backend = "reference" | "gpu";

export interface LocalStageOptions {
  readonly backend: Backend;
  /** GPU provider: auto, builtin or dawn (GPU backend only). */
  readonly gpu?: string;
  readonly allowSoftwareGpu?: boolean;
  readonly first: number;
  /** Defaults to the model's layer count. */
  readonly end?: number;
  readonly slots: number;
  readonly ctx: number;
  readonly maxBatch?: number;
  readonly snapshots?: number;
}

/** Parses `--backend`; the GPU engine is the default, the CPU reference the slow fallback. */
export function parseBackend(value: string | undefined): Backend {
  if (value === undefined || value === "gpu") return "gpu";
  if (value === "reference") return "reference";
  throw new TypeError(`Cannot use --backend "${value}": expected "reference" or "gpu"`);
}

/** Parses `--gpu`. */
export function parseProviderChoice(value: string): ProviderChoice {
  if ((PROVIDER_CHOICES as readonly string[]).includes(value)) return value as ProviderChoice;
  throw new TypeError(
    `Cannot use --gpu "${value}": expected one of ${PROVIDER_CHOICES.join(", ")}`,
  );
}

/** Parses `a:b` into a layer range. */
export function parseLayers(value: string): { first: number; end: number } {
  const m = /^(\d+):(\d+)$/.exec(value);
  if (!m || Number(m[1]) >= Number(m[2])) {
    throw new RangeError(`Cannot use --layers "${value}": expected a:b with a < b, e.g. 0:20`);
  }
  return { first: Number(m[1]), end: Number(m[2]) };
}

export async function openLocalStage(model: GgufModel, options: LocalStageOptions): Promise<Stage> {
  const nLayer = readHParams(model.metadata).nLayer;
  const end = options.end ?? nLayer;
  if (end > nLayer) {
    throw new RangeError(
      `Cannot open layers ${options.first}:${end}: the model has ${nLayer} layers; check --layers`,
    );
  }
  if (options.backend === "reference") return await openReferenceStage(model, { ...options, end });
  // Imported on demand: a reference-backend worker never loads the GPU providers (Dawn needs FFI).
  const { openGpu } = await import("./gpu/device.ts");
  const { openGpuStage } = await import("./gpu/gpu_stage.ts");
  const gpu = await openGpu({
    gpu: parseProviderChoice(options.gpu ?? "auto"),
    allowSoftware: options.allowSoftwareGpu,
  });
  return await openGpuStage(model, gpu, { ...options, end });
}
