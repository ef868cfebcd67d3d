/** EchoMQ for Node.js: a producer running the same Lua scripts as the Python package. */
export { Queue } from "./queue";
export type { Counts, Job, JobSpec, QueueOptions } from "./queue";
export type { JobOptions } from "./admit";
export {
  EchoMQError,
  InvalidName,
  InvalidSchedule,
  JobFailed,
  JobNotFound,
  PayloadError,
  ProtocolMismatch,
  UnknownDependency,
  TimeoutError,
  ValueError,
} from "./errors";
export { PROTOCOL_VERSION } from "./protocol";
export { validateJobId, validateName } from "./keys";
export { LUA_DIR } from "./scripts";
