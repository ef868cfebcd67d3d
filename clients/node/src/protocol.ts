/** The wire protocol's version (docs/protocol.md), recorded in each queue's meta. */
import { ProtocolMismatch, pyRepr } from "./errors";

export const PROTOCOL_VERSION = "1.3";
export const PROTOCOL_FIELD = "protocol";

/** The MAJOR part of "MAJOR.MINOR", null when the text is not a version. */
export function major(version: string): number | null {
  const m = /^([0-9]+)\.([0-9]+)$/.exec(version);
  return m ? Number(m[1]) : null;
}

/** Throw ProtocolMismatch unless `recorded` (null: none recorded) has this client's MAJOR. */
export function checkProtocol(queue: string, recorded: string | null): void {
  if (recorded === null) return;
  if (major(recorded) !== major(PROTOCOL_VERSION)) {
    throw new ProtocolMismatch(
      `queue ${pyRepr(queue)} speaks protocol ${pyRepr(recorded)} (meta field 'protocol'), this client ` +
        `speaks ${PROTOCOL_VERSION}: a different MAJOR version, nothing was admitted. Use a ` +
        "client of the queue's major version (see docs/protocol.md)",
    );
  }
}
