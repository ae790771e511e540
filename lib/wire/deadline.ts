// Time limits for socket work: connect, handshake, one reply, a refusal's last write.
// Used by peer.ts and stage_server.ts so that no wait on the other side is unbounded.

/**
 * Settles like `work`, or rejects with `timeout()` once `ms` have passed. The timer is cleared
 * either way. `work` keeps running after a timeout; the caller closes the socket under it.
 */
export function deadline<T>(work: Promise<T>, ms: number, timeout: () => Error): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const expired = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(timeout()), ms);
  });
  // A failure of `work` after the deadline already fired has no one left to tell.
  work.catch(() => undefined);
  return Promise.race([work, expired]).finally(() => clearTimeout(timer));
}
