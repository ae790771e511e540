// `deno task probe`: asks a worker (and the chain behind it) whether it serves, over the stage wire.
// An operator's check beside the data path: the hello a head would get, then one PING round trip.
//
//   deno task probe --worker 10.0.0.3:9000 [--key-file wire-key]

import {
  address,
  type Command,
  flag,
  type FlagTable,
  requiredFlag,
  runCommand,
  text,
} from "../lib/cli.ts";
import { hex, loadKeyFile } from "../lib/wire/hello.ts";
import { ErrorCode } from "../lib/wire/frame.ts";
import { connectPeer, StageUnavailableError } from "../lib/wire/peer.ts";

/**
 * One line describing the worker at `address`; throws StageUnavailableError with the reason. A
 * worker serves one client at a time, so one that serves its head answers Busy after checking the
 * key: it is up, and the head's GET /health is what checks the chain behind it.
 */
export async function probeWorker(address: string, key?: CryptoKey): Promise<string> {
  let peer;
  try {
    peer = await connectPeer(address, undefined, { key, connectTimeoutMs: 5000 });
  } catch (e) {
    if (!(e instanceof StageUnavailableError) || e.code !== ErrorCode.Busy) throw e;
    return `${address}: up, serving another client (${e.reason}); ask that head's GET /health ` +
      `for the chain behind it`;
  }
  try {
    const started = performance.now();
    await peer.ping();
    const rtt = performance.now() - started;
    const i = peer.info;
    return `${address}: layers ${i.first}..${i.end} of ${i.nLayer}, n_embd ${i.nEmbd}, slots ` +
      `${i.slots}, ctx ${i.ctx}, snapshots ${i.snapshots}, max batch ${i.maxBatch}, fingerprint ` +
      `${hex(i.fingerprint).slice(0, 16)}; PING ${rtt.toFixed(2)} ms`;
  } finally {
    peer.close();
  }
}

export const PROBE = {
  name: "Probe",
  usage: "deno task probe",
  about: "Says whether a worker (and the chain behind it) serves: the hello it gives a head, " +
    "then one PING round trip; a worker busy with its head says so after checking the key. " +
    "Exits 1 with the reason when it does not serve.",
  flags: {
    worker: requiredFlag(address, "the worker to ask"),
    "key-file": flag(text("PATH"), "the wire's shared key, when the worker checks one"),
  },
} satisfies Command<FlagTable>;

if (import.meta.main) {
  await runCommand(PROBE, async (flags) => {
    const key = flags["key-file"] ? await loadKeyFile(flags["key-file"]) : undefined;
    console.log(await probeWorker(flags.worker, key));
  });
}
