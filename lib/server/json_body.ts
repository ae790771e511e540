// Request body → JSON object without holding the event loop: the bytes are read up to the size
// limit, checked for nesting and value count and decoded in slices that yield, then parsed.
// Called by lib/server/handler.ts for every POST route.

import { ApiError } from "./api_error.ts";
import { type JsonObject, parseBody } from "./fields.ts";

/** Deepest nesting of arrays and objects a body may have: far beyond any tool schema. */
export const MAX_JSON_DEPTH = 128;
/**
 * Most JSON values (counted by their separators and openers) a body may hold. JSON.parse spends
 * ~70 ns a value on a busy 2-core box, so a body within this parses in well under 100 ms; a
 * 262k-token /completion id list fits.
 */
export const MAX_JSON_VALUES = 1_000_000;
/** Bytes checked and decoded between yields to the event loop (~1-3 ms of work). */
const SLICE_BYTES = 1 << 20;

const QUOTE = 0x22, BACKSLASH = 0x5c, COMMA = 0x2c, COLON = 0x3a;
const OPEN_OBJECT = 0x7b, CLOSE_OBJECT = 0x7d, OPEN_ARRAY = 0x5b, CLOSE_ARRAY = 0x5d;

const yieldToLoop = () => new Promise<void>((resolve) => setTimeout(resolve, 0));

/**
 * A running count of a JSON text's values and nesting, fed slice by slice. Counts are upper
 * bounds for valid JSON and meaningless for invalid JSON, which JSON.parse then refuses.
 */
class JsonShape {
  depth = 0;
  values = 0;
  #inString = false;
  /** Backslashes just before the slice's end, inside a string: an odd count escapes a quote. */
  #backslashes = 0;

  /** Scans `bytes`; throws the 400 as soon as a bound is crossed. */
  scan(bytes: Uint8Array): void {
    let depth = this.depth, values = this.values;
    let i = 0;
    if (this.#inString) i = this.#stringEnd(bytes, 0);
    for (; i < bytes.length; i++) {
      switch (bytes[i]) {
        case QUOTE:
          // Strings (most of a prompt's bytes) are skipped by the native search for quotes.
          i = this.#stringEnd(bytes, i + 1) - 1;
          break;
        case OPEN_OBJECT:
        case OPEN_ARRAY:
          values++;
          if (++depth > MAX_JSON_DEPTH) {
            throw new ApiError(
              "invalid_request",
              `The request body nests JSON deeper than ${MAX_JSON_DEPTH} levels; flatten it`,
            );
          }
          break;
        case CLOSE_OBJECT:
        case CLOSE_ARRAY:
          depth--;
          break;
        case COMMA:
        case COLON:
          values++;
          break;
      }
    }
    if (values > MAX_JSON_VALUES) {
      throw new ApiError(
        "invalid_request",
        `The request body holds more than ${MAX_JSON_VALUES} JSON values; send fewer`,
      );
    }
    this.depth = depth;
    this.values = values;
  }

  /** Index after the quote closing the string that `from` is inside, or bytes.length. */
  #stringEnd(bytes: Uint8Array, from: number): number {
    let backslashes = this.#backslashes;
    for (let at = from;;) {
      const quote = bytes.indexOf(QUOTE, at);
      const end = quote === -1 ? bytes.length : quote;
      let run = 0;
      while (run < end - at && bytes[end - 1 - run] === BACKSLASH) run++;
      backslashes = run === end - at ? backslashes + run : run;
      if (quote === -1) {
        this.#inString = true;
        this.#backslashes = backslashes;
        return bytes.length;
      }
      if (backslashes % 2 === 0) {
        this.#inString = false;
        this.#backslashes = 0;
        return quote + 1;
      }
      backslashes = 0;
      at = quote + 1;
    }
  }
}

/**
 * Reads a POST body as a JSON object: 413 past `limit` bytes, 400 when it is empty, not UTF-8,
 * nested deeper than MAX_JSON_DEPTH, holds more than MAX_JSON_VALUES values, or is not a JSON
 * object. Each chunk is checked and decoded as it arrives, so a hostile body is refused at its
 * first bad slice and no step holds the event loop for more than one slice (or the final join,
 * or the parse).
 */
export async function readJsonBody(request: Request, limit: number): Promise<JsonObject> {
  const tooLarge = (size: string) =>
    new ApiError(
      "request_too_large",
      `Request body is ${size} bytes; the limit is ${limit} bytes. Send a shorter request`,
    );
  const declared = Number(request.headers.get("content-length"));
  if (declared > limit) throw tooLarge(String(declared));
  const shape = new JsonShape();
  const decoder = new TextDecoder("utf-8", { fatal: true });
  const parts: string[] = [];
  const decode = (bytes?: Uint8Array) => {
    try {
      parts.push(decoder.decode(bytes, { stream: bytes !== undefined }));
    } catch (e) {
      throw new ApiError("invalid_request", "The request body is not UTF-8 text", { cause: e });
    }
  };
  let total = 0;
  // Reads of buffered chunks resolve as microtasks, which never let timers or I/O in: the loop
  // yields by itself once per SLICE_BYTES, however the bytes came in.
  let sinceYield = 0;
  const reader = request.body?.getReader();
  try {
    while (reader) {
      const { done, value } = await reader.read();
      if (done) break;
      total += value.length;
      if (total > limit) throw tooLarge(`more than ${limit}`);
      for (let at = 0; at < value.length; at += SLICE_BYTES) {
        if (sinceYield >= SLICE_BYTES) {
          await yieldToLoop();
          sinceYield = 0;
        }
        const slice = value.subarray(at, at + SLICE_BYTES);
        shape.scan(slice);
        decode(slice);
        sinceYield += slice.length;
      }
    }
    decode();
  } catch (e) {
    await reader?.cancel().catch(() => undefined);
    throw e;
  }
  if (total === 0) {
    throw new ApiError("invalid_request", "The request has no body; send a JSON object");
  }
  // Joining a 32 MiB body and parsing it each take tens of ms: one turn of the loop apiece. A
  // body of one slice joins and parses in well under a millisecond, less than a turn costs
  // (setTimeout(0) waits 1-2 ms).
  const large = total > SLICE_BYTES;
  if (large) await yieldToLoop();
  const text = parts.join("");
  if (large) await yieldToLoop();
  return parseBody(text);
}
