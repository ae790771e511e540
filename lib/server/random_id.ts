// Random ids of requests, messages and tool calls (req_…, msg_…, toolu_…, chatcmpl-…, call_…),
// made by the handler and the routes.

const ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/** `prefix` + 24 random base-62 characters, like Anthropic's and OpenAI's ids. */
export function randomId(prefix: string): string {
  const bytes = crypto.getRandomValues(new Uint8Array(24));
  return prefix + Array.from(bytes, (b) => ALPHABET[b % ALPHABET.length]).join("");
}
