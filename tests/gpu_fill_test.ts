// Filling GPU buffers piece by piece (engine/gpu/buffers.ts fillStorage), the way model weights
// are uploaded: mapped at creation (Dawn's way) and through writeBuffer (the builtin's way).

import assert from "node:assert/strict";
import { fillStorage, readBuffer } from "../engine/gpu/buffers.ts";
import { gpuTest } from "./_gpu.ts";

/** Content byte i of the test buffer. */
const byteAt = (i: number) => (i * 131 + 7) & 255;

for (const mapped of [true, false]) {
  gpuTest(
    `fillStorage ${
      mapped ? "mapped at creation" : "through writeBuffer"
    }: every piece in place, zeros after`,
    async (ctx) => {
      const bytes = 10_003;
      const offsets: number[] = [];
      const heard: number[] = [];
      const buffer = await fillStorage(ctx, "filled", bytes, (dst, offset) => {
        offsets.push(offset);
        for (let i = 0; i < dst.length; i++) dst[i] = byteAt(offset + i);
        return Promise.resolve();
      }, { mapped, padding: 4, pieceBytes: 4096, onPiece: (n) => heard.push(n) });
      try {
        assert.deepEqual(offsets, [0, 4096, 8192]);
        assert.deepEqual(heard, [4096, 4096, 1811]);
        assert.equal(buffer.size, 10_008);
        const back = new Uint8Array(await readBuffer(ctx, buffer, 0, buffer.size));
        assert.deepEqual(
          back.subarray(0, bytes),
          Uint8Array.from({ length: bytes }, (_, i) => byteAt(i)),
        );
        assert.deepEqual(back.subarray(bytes), new Uint8Array(5));
      } finally {
        buffer.destroy();
      }
    },
  );

  gpuTest(`fillStorage ${mapped ? "mapped" : "written"}: a failing fill is thrown`, async (ctx) => {
    let calls = 0;
    await assert.rejects(
      fillStorage(ctx, "broken", 9000, () => {
        calls++;
        return calls === 2 ? Promise.reject(new Error("disk gone")) : Promise.resolve();
      }, { mapped, pieceBytes: 4096 }),
      /disk gone/,
    );
  });
}
