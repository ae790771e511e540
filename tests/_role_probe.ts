// A role started exactly as main.ts / worker.ts start theirs (lib/launch/launch.ts, the same flags
// and grant), which first tries what its grant must refuse, reports, and then serves as the role.
// Started by tests/role_grants_test.ts with the flags of `deno task head|worker`.
//
// TANDEM_PROBE_ROLE picks the role; TANDEM_PROBE_READ is a file and TANDEM_PROBE_CONNECT a
// host:port outside the grant.

import { runRole } from "../lib/launch/launch.ts";
import { parseAddress } from "../lib/wire/peer.ts";
import { HEAD, prepareHead, serveHead } from "../main.ts";
import { serveWorker, WORKER } from "../worker.ts";

/** What one attempt met: "allowed" or the error's name (NotCapable when the grant refuses it). */
async function attempt(action: () => Promise<unknown>): Promise<string> {
  try {
    await action();
    return "allowed";
  } catch (e) {
    return (e as Error).name;
  }
}

/** Tries a read, a connect and a write outside the grant and prints what each met. */
async function tryOutside(): Promise<void> {
  const path = Deno.env.get("TANDEM_PROBE_READ")!;
  const { hostname, port } = parseAddress(Deno.env.get("TANDEM_PROBE_CONNECT")!);
  const results = {
    read: await attempt(() => Deno.readFile(path)),
    connect: await attempt(async () => (await Deno.connect({ hostname, port })).close()),
    write: await attempt(() => Deno.writeTextFile(`${path}.probe`, "x")),
    run: await attempt(() => new Deno.Command("true").output()),
  };
  console.error(`probe: ${JSON.stringify(results)}`);
}

const url = import.meta.url;
if (import.meta.main) {
  if (Deno.env.get("TANDEM_PROBE_ROLE") === "head") {
    await runRole("head", HEAD, url, prepareHead, async (f, files) => {
      await tryOutside();
      await serveHead(f, files);
    });
  } else {
    await runRole("worker", WORKER, url, (f) => ({ values: f, touches: f }), async (f, files) => {
      await tryOutside();
      await serveWorker(f, files);
    });
  }
}
