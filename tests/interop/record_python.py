"""Records what the CloudEvents Python SDK (cloudevents 2.x, Kafka binding) writes, as
fixtures the inbox's tests replay (tests/tests/foreign_producers.rs): nothing is sent to a
broker here, so the fixtures are exactly the SDK's bytes.

    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install 'cloudevents==2.2.*'
    /tmp/venv/bin/python tests/interop/record_python.py > tests/interop/fixtures/python.json

Each record says what the inbox must make of it: `applied` (with the event id it dedups
on, for ids that are not UUIDs), or `parked` with the start of the reason.
"""

import base64
import json
import sys
from datetime import datetime, timezone
from importlib.metadata import version

from cloudevents.core.bindings import kafka
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent

FORMAT = JSONFormat()
TIME = datetime(2026, 12, 1, 12, 0, 0, tzinfo=timezone.utc)


def event(attributes, data):
    base = {
        "specversion": "1.0",
        "source": "/python-billing",
        "type": "test.credit",
        "time": TIME,
    }
    base.update(attributes)
    return CloudEvent(attributes=base, data=data)


def record(name, message, expect):
    headers = [[k, None if v is None else v.decode("utf-8")] for k, v in message.headers.items()]
    key = message.key.decode("utf-8") if isinstance(message.key, bytes) else message.key
    return {
        "name": name,
        "key": key,
        "value_base64": base64.b64encode(message.value).decode("ascii"),
        "headers": headers,
        "expect": expect,
    }


def main():
    records = [
        # Binary mode with the outbox's own extension for the version.
        record(
            "binary, schemaversion extension, non-UUID id",
            kafka.to_binary(
                event(
                    {
                        "id": "py-credit-1",
                        "datacontenttype": "application/json",
                        "subject": "acc-py-1",
                        "partitionkey": "acc-py-1",
                        "schemaversion": 1,
                    },
                    {"account": "acc-py-1", "amount": 5},
                ),
                FORMAT,
            ),
            {"outcome": "applied", "id": "py-credit-1", "source": "/python-billing"},
        ),
        # A plain CloudEvent: no outbox extension, the version named by dataschema only.
        record(
            "binary, dataschema only",
            kafka.to_binary(
                event(
                    {
                        "id": "py-credit-2",
                        "datacontenttype": "application/json",
                        "dataschema": "https://schemas.example.com/test.credit/v1.json",
                        "partitionkey": "acc-py-2",
                    },
                    {"account": "acc-py-2", "amount": 7},
                ),
                FORMAT,
            ),
            {"outcome": "applied", "id": "py-credit-2", "source": "/python-billing"},
        ),
        # Structured mode: the whole event in the value.
        record(
            "structured",
            kafka.to_structured(
                event(
                    {
                        "id": "py-credit-3",
                        "datacontenttype": "application/json",
                        "dataschema": "urn:outbox:schemas/test.credit/v1.json",
                        "subject": "acc-py-3",
                        "partitionkey": "acc-py-3",
                    },
                    {"account": "acc-py-3", "amount": 11},
                ),
                FORMAT,
            ),
            {"outcome": "applied", "id": "py-credit-3", "source": "/python-billing"},
        ),
        # What the inbox must refuse, with its reason.
        record(
            "binary without any version",
            kafka.to_binary(
                event(
                    {"id": "py-credit-4", "datacontenttype": "application/json", "partitionkey": "acc-py-4"},
                    {"account": "acc-py-4", "amount": 1},
                ),
                FORMAT,
            ),
            {"outcome": "parked", "reason": "no schema version"},
        ),
        record(
            "binary without datacontenttype (2.2 still writes JSON; older SDKs wrote a repr)",
            kafka.to_binary(
                event(
                    {"id": "py-credit-5", "schemaversion": 1, "partitionkey": "acc-py-5"},
                    {"account": "acc-py-5", "amount": 1},
                ),
                FORMAT,
            ),
            {"outcome": "applied", "id": "py-credit-5", "source": "/python-billing"},
        ),
    ]
    json.dump(
        {"producer": f"cloudevents {version('cloudevents')} (Python)", "records": records},
        sys.stdout,
        indent=2,
    )
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
