// The text of every wgsl/ file, imported into the module graph: a compiled binary carries it and a
// stage reads no file at run time. engine/gpu/wgsl.ts expands these; the contract test keeps the
// list equal to the files in wgsl/.

import argmax from "../../wgsl/argmax.wgsl" with { type: "text" };
import attention from "../../wgsl/attention.wgsl" with { type: "text" };
import attentionCombine from "../../wgsl/attention_combine.wgsl" with { type: "text" };
import gatedDeltaNet from "../../wgsl/gated_delta_net.wgsl" with { type: "text" };
import getRows from "../../wgsl/get_rows.wgsl" with { type: "text" };
import logitAdjust from "../../wgsl/logit_adjust.wgsl" with { type: "text" };
import mmaInput from "../../wgsl/mma_input.wgsl" with { type: "text" };
import moeGather from "../../wgsl/moe_gather.wgsl" with { type: "text" };
import moeRoute from "../../wgsl/moe_route.wgsl" with { type: "text" };
import moeSum from "../../wgsl/moe_sum.wgsl" with { type: "text" };
import mulMat from "../../wgsl/mul_mat.wgsl" with { type: "text" };
import mulMatMma from "../../wgsl/mul_mat_mma.wgsl" with { type: "text" };
import mulMatVec from "../../wgsl/mul_mat_vec.wgsl" with { type: "text" };
import qkNormRope from "../../wgsl/qk_norm_rope.wgsl" with { type: "text" };
import repack from "../../wgsl/repack.wgsl" with { type: "text" };
import rmsNorm from "../../wgsl/rms_norm.wgsl" with { type: "text" };
import sample from "../../wgsl/sample.wgsl" with { type: "text" };
import ssmConv from "../../wgsl/ssm_conv.wgsl" with { type: "text" };
import topk from "../../wgsl/topk.wgsl" with { type: "text" };
import dequant from "../../wgsl/_include/dequant.wgsl" with { type: "text" };
import f16Round from "../../wgsl/_include/f16_round.wgsl" with { type: "text" };
import gatherTile from "../../wgsl/_include/gather_tile.wgsl" with { type: "text" };
import matParams from "../../wgsl/_include/mat_params.wgsl" with { type: "text" };
import reduce from "../../wgsl/_include/reduce.wgsl" with { type: "text" };
import rms from "../../wgsl/_include/rms.wgsl" with { type: "text" };

/** wgsl/<name> → its text, e.g. "mul_mat.wgsl", "_include/dequant.wgsl". */
export const WGSL_SOURCES: ReadonlyMap<string, string> = new Map([
  ["argmax.wgsl", argmax],
  ["attention.wgsl", attention],
  ["attention_combine.wgsl", attentionCombine],
  ["gated_delta_net.wgsl", gatedDeltaNet],
  ["get_rows.wgsl", getRows],
  ["logit_adjust.wgsl", logitAdjust],
  ["mma_input.wgsl", mmaInput],
  ["moe_gather.wgsl", moeGather],
  ["moe_route.wgsl", moeRoute],
  ["moe_sum.wgsl", moeSum],
  ["mul_mat.wgsl", mulMat],
  ["mul_mat_mma.wgsl", mulMatMma],
  ["mul_mat_vec.wgsl", mulMatVec],
  ["qk_norm_rope.wgsl", qkNormRope],
  ["repack.wgsl", repack],
  ["rms_norm.wgsl", rmsNorm],
  ["sample.wgsl", sample],
  ["ssm_conv.wgsl", ssmConv],
  ["topk.wgsl", topk],
  ["_include/dequant.wgsl", dequant],
  ["_include/f16_round.wgsl", f16Round],
  ["_include/gather_tile.wgsl", gatherTile],
  ["_include/mat_params.wgsl", matParams],
  ["_include/reduce.wgsl", reduce],
  ["_include/rms.wgsl", rms],
]);
