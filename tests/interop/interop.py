"""The outbox from another language, with the clients other teams use: confluent-kafka and
the CloudEvents Python SDK (cloudevents 2.x) and jsonschema. Run by
tests/tests/interop_python.rs (`cargo test -p outbox-tests --test interop_python --
--ignored`, which `.ci/run` does against its Tansu broker), in a throwaway venv:

    python3 -m venv /tmp/venv
    /tmp/venv/bin/pip install -r tests/interop/requirements.txt
    OUTBOX_INTEROP_PYTHON=/tmp/venv/bin/python cargo test -p outbox-tests --test interop_python -- --ignored

Commands (each prints one JSON object on stdout; exit 1 on a failed check, 2 on bad input):

  consume BOOTSTRAP TOPIC SCHEMAS_DIR EVENT_ID...
      Reads the relay's records of those event ids from TOPIC, parses each with the SDK
      (binary mode), and checks that `dataschema` names a committed schema (the `$id` of a
      file under SCHEMAS_DIR) whose version is `schemaversion`, and that the data validates
      against that schema.

  produce BOOTSTRAP TOPIC COUNT
      Writes COUNT credits (`test.credit` v1) in binary mode and COUNT in structured mode,
      with ids that are not UUIDs, keyed by account, and prints what it wrote.

  consume-registry BOOTSTRAP TOPIC REGISTRY_URL EVENT_ID...
      Reads the relay's records of those event ids from TOPIC with the schema registry's
      JSONDeserializer (confluent-kafka[schemaregistry]): the writer schema fetched from
      the registry by the id in the prefix or the GUID in the header, the data validated
      against it. Prints, per record, the framing, the id or GUID and the data.

  produce-registry BOOTSTRAP TOPIC REGISTRY_URL COUNT
      Writes COUNT credits framed by JSONSerializer in the prefix form and COUNT in the
      header form (the schema auto-registered as <topic>-value), each with CloudEvents
      binary-mode headers, and prints what it wrote.
"""

import json
import pathlib
import sys
import time
import uuid

import jsonschema
from cloudevents.core.bindings import kafka
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent
from confluent_kafka import Consumer, Producer
from confluent_kafka.schema_registry import (
    SchemaRegistryClient,
    SchemaRegistryError,
    dual_schema_id_deserializer,
    header_schema_id_serializer,
    prefix_schema_id_serializer,
)
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.serialization import MessageField, SerializationContext, SerializationError

FORMAT = JSONFormat()


def fail(message, **details):
    print(json.dumps({"ok": False, "error": message, **details}))
    sys.exit(1)


def committed_schemas(directory):
    by_id = {}
    for path in pathlib.Path(directory).glob("*/v*.json"):
        document = json.loads(path.read_text())
        if "$id" not in document:
            fail(f"{path} has no $id")
        by_id[document["$id"]] = (path, document)
    if not by_id:
        print(json.dumps({"ok": False, "error": f"no committed schemas under {directory}"}))
        sys.exit(2)
    return by_id


def read_records(bootstrap, topic, wanted, read_one):
    """Reads TOPIC until a record of each wanted event id (its ce_id header) is read, within
    120 s; read_one(message, headers, event_id) makes each one's report. Prints the reports."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"interop-{uuid.uuid4()}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    wanted = set(wanted)
    seen = {}
    deadline = time.monotonic() + 120
    while wanted - seen.keys() and time.monotonic() < deadline:
        message = consumer.poll(1.0)
        if message is None or message.error():
            continue
        headers = message.headers() or []
        event_id = (dict(headers).get("ce_id") or b"").decode()
        if event_id in wanted:
            seen[event_id] = read_one(message, headers, event_id)
    consumer.close()
    missing = sorted(wanted - seen.keys())
    if missing:
        fail("records not found", missing=missing)
    print(json.dumps({"ok": True, "checked": len(seen), "records": seen}))


def consume(bootstrap, topic, schemas_dir, wanted):
    schemas = committed_schemas(schemas_dir)

    def read_one(message, headers, event_id):
        event = kafka.from_binary(
            kafka.KafkaMessage(headers=dict(headers), key=message.key(), value=message.value()),
            FORMAT,
        )
        dataschema = event.get_dataschema()
        if dataschema not in schemas:
            fail("dataschema names no committed schema", event_id=event_id, dataschema=dataschema)
        path, document = schemas[dataschema]
        version = event.get_extension("schemaversion")
        if path.stem != f"v{version}":
            fail("dataschema and schemaversion disagree", dataschema=dataschema, schemaversion=version)
        if event.get_type() != document["x-outbox"]["event_type"]:
            fail("the schema is another event type's", type=event.get_type(), schema=str(path))
        try:
            jsonschema.Draft202012Validator(document).validate(event.get_data())
        except jsonschema.ValidationError as error:
            fail("data does not validate against the committed schema", event_id=event_id, error=error.message)
        return {
            "type": event.get_type(),
            "source": event.get_source(),
            "dataschema": dataschema,
            "schema": str(path.relative_to(schemas_dir)),
            "partition": message.partition(),
        }

    read_records(bootstrap, topic, wanted, read_one)


def credit_attributes(event_id, account):
    """The CloudEvents attributes of a test.credit: a plain CloudEvent, its version only in
    the standard dataschema attribute."""
    return {
        "specversion": "1.0",
        "id": event_id,
        "source": "/interop-python",
        "type": "test.credit",
        "datacontenttype": "application/json",
        "subject": account,
        "partitionkey": account,
        "dataschema": "urn:outbox:schemas/test.credit/v1.json",
    }


def produce(bootstrap, topic, count):
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "partitioner": "murmur2_random"})
    written = []

    def credit(n, mode):
        account = f"acc-py-{n % 3}"
        attributes = credit_attributes(f"python-{mode}-{n}", account)
        event = CloudEvent(attributes=attributes, data={"account": account, "amount": 100 + n})
        message = kafka.to_binary(event, FORMAT) if mode == "binary" else kafka.to_structured(event, FORMAT)
        producer.produce(topic, key=message.key, value=message.value, headers=list(message.headers.items()))
        written.append({"id": attributes["id"], "source": attributes["source"], "mode": mode, "amount": 100 + n})

    for n in range(count):
        credit(n, "binary")
        credit(n, "structured")
    remaining = producer.flush(30)
    if remaining:
        fail(f"{remaining} records not delivered")
    print(json.dumps({"ok": True, "written": written}))


# Subjects named <topic>-value without first asking the registry for topic associations
# (2.16's default strategy does, and falls back to this on a 404).
TOPIC_SUBJECTS = {"subject.name.strategy.type": "TOPIC"}


def consume_registry(bootstrap, topic, registry_url, wanted):
    read = {}

    def recording(payload, ctx, schema_id):
        # The default reader (header first, then the prefix), noting what it read.
        rest = dual_schema_id_deserializer(payload, ctx, schema_id)
        read["id"] = schema_id.id
        read["guid"] = str(schema_id.guid) if schema_id.guid is not None else None
        return rest

    deserializer = JSONDeserializer(
        None,
        schema_registry_client=SchemaRegistryClient({"url": registry_url}),
        conf={**TOPIC_SUBJECTS, "schema.id.deserializer": recording},
    )

    def read_one(message, headers, event_id):
        read.clear()
        try:
            data = deserializer(message.value(), SerializationContext(topic, MessageField.VALUE, headers))
        except (SerializationError, SchemaRegistryError) as error:
            fail("the registry's deserializer refused a record", event_id=event_id, error=str(error))
        return {
            "framing": "header" if any(k == "__value_schema_id" for k, _ in headers) else "prefix",
            "schema_id": read.get("id"),
            "schema_guid": read.get("guid"),
            "data": data,
        }

    read_records(bootstrap, topic, wanted, read_one)


CREDIT_SCHEMA = json.dumps(
    {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "urn:outbox:schemas/test.credit/v1.json",
        "title": "test.credit v1",
        "type": "object",
        "properties": {"account": {"type": "string"}, "amount": {"type": "integer"}},
        "required": ["account", "amount"],
    }
)


def produce_registry(bootstrap, topic, registry_url, count):
    client = SchemaRegistryClient({"url": registry_url})
    serializers = {
        form: JSONSerializer(CREDIT_SCHEMA, client, conf={**TOPIC_SUBJECTS, "schema.id.serializer": write_id})
        for form, write_id in (("prefix", prefix_schema_id_serializer), ("header", header_schema_id_serializer))
    }
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "partitioner": "murmur2_random"})
    written = []
    for n in range(count):
        for form, serializer in serializers.items():
            account = f"acc-sr-{n % 3}"
            data = {"account": account, "amount": 200 + n}
            attributes = credit_attributes(f"python-registry-{form}-{n}", account)
            message = kafka.to_binary(CloudEvent(attributes=attributes, data=data), FORMAT)
            headers = list(message.headers.items())
            # The header form appends ("__value_schema_id", 0x01 + GUID) to these headers.
            value = serializer(data, SerializationContext(topic, MessageField.VALUE, headers))
            producer.produce(topic, key=message.key, value=value, headers=headers)
            written.append({"id": attributes["id"], "source": attributes["source"], "form": form, "amount": data["amount"]})
    remaining = producer.flush(30)
    if remaining:
        fail(f"{remaining} records not delivered")
    print(json.dumps({"ok": True, "written": written}))


def main(argv):
    try:
        command, bootstrap, topic, *rest = argv
        if command == "consume":
            schemas_dir, *ids = rest
            consume(bootstrap, topic, schemas_dir, ids)
        elif command == "produce":
            (count,) = rest
            produce(bootstrap, topic, int(count))
        elif command == "consume-registry":
            registry_url, *ids = rest
            consume_registry(bootstrap, topic, registry_url, ids)
        elif command == "produce-registry":
            registry_url, count = rest
            produce_registry(bootstrap, topic, registry_url, int(count))
        else:
            raise ValueError(command)
    except ValueError as error:
        print(json.dumps({"ok": False, "error": f"bad arguments: {error}", "usage": __doc__}))
        sys.exit(2)


if __name__ == "__main__":
    main(sys.argv[1:])
