// The few host globals index.d.ts and usage.ts need (instead of lib.dom or
// @types/node, which would make this check several times slower).
interface AbortSignal {
  readonly aborted: boolean;
  readonly reason: unknown;
}
declare var AbortSignal: { timeout(ms: number): AbortSignal; abort(reason?: unknown): AbortSignal };
declare var console: { log(...args: unknown[]): void };
