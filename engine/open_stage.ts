// Opens the local stage of this process on the chosen backend (GPU engine or CPU reference).
// The one switch point between engines; generate, worker and head all open stages here.

import type { GgufModel } from "./gguf/gguf_model.ts";
import { missingLayers } from "./gguf/stage_shard.ts";
import type { ProviderChoice } from "./gpu/provider.ts";
import { modelHParams } from "./hparams.ts";
import { openReferenceStage } from "./reference/reference_stage.ts";
import type { Stage, StageOpenOptions } from "./stage.ts";
import { checkOpenOptions } from "./stage_checks.ts";

/** The engines a stage can run on, as --backend names them. */
export const BACKENDS = ["gpu", "reference"] as const;
export type Backend = typeof BACKENDS[number];

/** The engine a stage runs on: what --backend, --gpu and --allow-software-gpu say (lib/cli.ts). */
export interface EngineChoice {
  readonly backend: Backend;
  /** GPU provider (GPU backend only); default auto. */
  readonly gpu?: ProviderChoice;
  readonly allowSoftwareGpu?: boolean;
}

export interface LocalStageOptions extends Omit<StageOpenOptions, "end"> {
  readonly engine: EngineChoice;
  /** Defaults to the model's layer count. */
  readonly end?: number;
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
  const hp = options.hp ?? modelHParams(model);
  const opening = { ...options, hp, end: options.end ?? hp.nLayer };
  // Checked before the shard's tensors, so a range past the model is named as such.
  const { first, end } = checkOpenOptions(opening, hp.nLayer);
  const missing = missingLayers(model, hp.nLayer, { first, end });
  if (missing) throw new RangeError(missing);
  const { backend, gpu, allowSoftwareGpu } = options.engine;
  if (backend === "reference") return await openReferenceStage(model, opening);
  quietWayland();
  // Imported on demand: a reference-backend worker never loads the GPU providers (Dawn needs FFI).
  const { openGpu } = await import("./gpu/device.ts");
  const { openGpuStage } = await import("./gpu/gpu_stage.ts");
  const context = await openGpu({ gpu: gpu ?? "auto", allowSoftware: allowSoftwareGpu });
  return await openGpuStage(model, context, opening);
}
