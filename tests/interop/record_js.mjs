// Records what the CloudEvents JavaScript SDK (cloudevents 10, Kafka binding) makes of
// events, as kafkajs would send them, as fixtures the inbox's tests replay
// (tests/tests/foreign_producers.rs). Nothing is sent to a broker.
//
//   npm install --ignore-scripts cloudevents@10   (in a scratch directory)
//   NODE_PATH=<scratch>/node_modules node tests/interop/record_js.mjs > tests/interop/fixtures/js.json
//
// kafkajs writes a header whose value is `undefined` (the SDK's unset attributes) as a
// null value and sends the message's `value` as given: a JSON string is what a producer
// must pass for binary mode, as the README says.
import { createRequire } from "node:module";
const require = createRequire(import.meta.url);
const { CloudEvent, Kafka } = require("cloudevents");
const sdkVersion = require("cloudevents/package.json").version;

const time = "2026-12-01T12:00:00.000Z";

function event(attributes, data) {
  return new CloudEvent({ specversion: "1.0", source: "/js-billing", type: "test.credit", time, ...attributes, data });
}

function record(name, message, expect, valueOf = (v) => v) {
  const value = valueOf(message.value);
  const bytes = typeof value === "string" ? Buffer.from(value, "utf8") : Buffer.from(value ?? []);
  return {
    name,
    key: message.key ?? null,
    value_base64: bytes.toString("base64"),
    headers: Object.entries(message.headers).map(([k, v]) => [k, v === undefined || v === null ? null : String(v)]),
    expect,
  };
}

const records = [
  record(
    "binary, schemaversion extension, UUID id, unset attributes as null headers",
    Kafka.binary(
      event(
        {
          id: "6b1f8e3c-2a4d-4f7e-9c1b-0d2e3f4a5b6c",
          datacontenttype: "application/json",
          partitionkey: "acc-js-1",
          schemaversion: "1",
        },
        { account: "acc-js-1", amount: 3 },
      ),
    ),
    { outcome: "applied", id: "6b1f8e3c-2a4d-4f7e-9c1b-0d2e3f4a5b6c", source: "/js-billing" },
    (v) => JSON.stringify(v),
  ),
  record(
    "binary, dataschema only, non-UUID id",
    Kafka.binary(
      event(
        {
          id: "js-credit-2",
          datacontenttype: "application/json",
          dataschema: "https://schemas.example.com/test.credit/v1.json",
          subject: "acc-js-2",
          partitionkey: "acc-js-2",
        },
        { account: "acc-js-2", amount: 4 },
      ),
    ),
    { outcome: "applied", id: "js-credit-2", source: "/js-billing" },
    (v) => JSON.stringify(v),
  ),
  record(
    "structured, charset parameter",
    Kafka.structured(
      event(
        {
          id: "js-credit-3",
          datacontenttype: "application/json",
          dataschema: "urn:outbox:schemas/test.credit/v1.json",
          partitionkey: "acc-js-3",
        },
        { account: "acc-js-3", amount: 6 },
      ),
    ),
    { outcome: "applied", id: "js-credit-3", source: "/js-billing" },
  ),
  record(
    "binary value passed as an object: kafkajs sends [object Object]",
    Kafka.binary(
      event(
        { id: "js-credit-4", datacontenttype: "application/json", partitionkey: "acc-js-4", schemaversion: "1" },
        { account: "acc-js-4", amount: 1 },
      ),
    ),
    { outcome: "parked", reason: "payload is not JSON" },
    (v) => String(v),
  ),
];

process.stdout.write(JSON.stringify({ producer: `cloudevents ${sdkVersion} (JavaScript)`, records }, null, 2) + "\n");
