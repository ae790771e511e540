// Opens the local stage of this process on the chosen backend (GPU engine or CPU reference).
// The one switch point between engines; generate, worker and head all open stages here.

import type { GgufModel } from "./gguf/gguf_model.ts";
import { missingLayers } from "./gguf/stage_shard.ts";
import type { ProviderChoice } from "./gpu/provider.ts";
import { type HParams, readHParams } from "./hparams.ts";
import { openReferenceStage } from "./reference/reference_stage.ts";
import type { Stage } from "./stage.ts";

export type Backend = "reference" | "gpu";

export interface LocalStageOptions {
  readonly backend: Backend;
  /** GPU provider (GPU backend only); default auto. */
  readonly gpu?: ProviderChoice;
  readonly allowSoftwareGpu?: boolean;
  readonly first: number;
  /** Defaults to the model's layer count. */
  readonly end?: number;
  readonly slots: number;
  readonly ctx: number;
  readonly maxBatch?: number;
  readonly snapshots?: number;
  /** The model's hyperparameters, when the caller has read them (else read from the model). */
  readonly hp?: HParams;
}

/**
 * Mesa's Vulkan drivers probe for a Wayland display through libwayland, which prints "error:
 * XDG_RUNTIME_DIR is invalid or not set in the environment." for every probe when the variable
 * is unset, as on a server or in a container. Any absolute path silences it (nothing is written
 * there); where the environment cannot be written, the lines stay and are harmless.
 */
function quietWayland(): void {
  const name = "XDG_RUNTIME_DIR";
  if (Deno.permissions.querySync({ name: "env", variable: name }).state !== "granted") return;
  if (Deno.env.get(name)?.startsWith("/")) return;
  Deno.env.set(name, "/tmp");
}

export async function openLocalStage(model: GgufModel, options: LocalStageOptions): Promise<Stage> {
  // Read once here (or by the caller) and handed to the stage.
  const hp = options.hp ?? readHParams(model.metadata);
  const end = options.end ?? hp.nLayer;
  if (end > hp.nLayer) {
    throw new RangeError(
      `Cannot open layers ${options.first}:${end}: the model has ${hp.nLayer} layers; check --layers`,
    );
  }
  const missing = missingLayers(model, hp.nLayer, { first: options.first, end });
  if (missing) throw new RangeError(missing);
  if (options.backend === "reference") {
    return await openReferenceStage(model, { ...options, hp, end });
  }
  quietWayland();
  // Imported on demand: a reference-backend worker never loads the GPU providers (Dawn needs FFI).
  const { openGpu } = await import("./gpu/device.ts");
  const { openGpuStage } = await import("./gpu/gpu_stage.ts");
  const gpu = await openGpu({
    gpu: options.gpu ?? "auto",
    allowSoftware: options.allowSoftwareGpu,
  });
  return await openGpuStage(model, gpu, { ...options, hp, end });
}
