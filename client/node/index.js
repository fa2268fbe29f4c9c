// polygw -- thin Node.js client of the polygw sidecar.
//
// The sidecar governs LLM API calls for every process on the host; this
// package only speaks its protocol (msgpack-RPC over a Unix socket,
// proto/PROTOCOL.md): no retries, limits or other governance happen here.

export { Client, CallStream, Task } from "./lib/client.js";
export {
  PolygwError, RetryLaterError, TaskNotRunningError,
  StalledError, RetryExhaustedError, BackendUnavailableError, OverloadedError, ShuttingDownError,
  UpstreamRejectedError, DeadlineExceededError, CancelledError, TaskStoppedError, GraphStoppedError,
  WatchdogTimeoutError, BudgetExhaustedError, StreamInterruptedError, BadRequestError, UnknownMethodError,
  UnknownCapabilityError, TooLargeError, InternalError, TasksNotSupportedError,
  ConnectionLostError, ConnectFailedError, ProtocolError, ClientTimeoutError,
  ERROR_CLASSES, errorFromWire,
} from "./lib/errors.js";
export {
  DEFAULT_SOCKET, DEFAULT_MAX_MESSAGE_BYTES, FrameReader, FrameError, NotRpcError,
  Decoder, decode, parseMessage, encodeRequest, encodeNotification, socketPath,
} from "./lib/protocol.js";

export const VERSION = "0.1.0";
