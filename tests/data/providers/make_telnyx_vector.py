"""Signs Telnyx-shaped deliveries with an ed25519 implementation independent of hookgate.

Source of telnyx.json. Telnyx's SDK tests sign with a key generated at run time, so they
carry no fixed vector; this script makes one the way Telnyx signs: the base64 ed25519
signature of `<telnyx-timestamp>|<raw body>`, checked against the base64 public key.
The seed is fixed, so the output is the same on every run (ed25519 is deterministic).

    python3 -m pip install cryptography
    python3 tests/data/providers/make_telnyx_vector.py > tests/data/providers/telnyx.json
"""

import base64
import json
from importlib.metadata import version

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

SEED = bytes(range(32))
key = Ed25519PrivateKey.from_private_bytes(SEED)
public = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def delivery(name: str, timestamp: str, body: dict) -> dict:
    raw = json.dumps(body, separators=(",", ":"))
    signature = key.sign(timestamp.encode() + b"|" + raw.encode())
    return {
        "name": name,
        "telnyx-timestamp": timestamp,
        "telnyx-signature-ed25519": b64(signature),
        "body": raw,
    }


finalized = {
    "data": {
        "event_type": "message.finalized",
        "id": "b301ed3f-1490-491f-995f-6e64e69674d4",
        "occurred_at": "2026-11-29T10:00:05.000+00:00",
        "payload": {
            "id": "40385f64-5717-4562-b3fc-2c963f66afa6",
            "direction": "outbound",
            "type": "SMS",
            "from": {"phone_number": "+13125550100", "carrier": "Telnyx", "line_type": "VoIP"},
            "to": [{"phone_number": "+13125550123", "status": "delivered", "carrier": "T-Mobile USA", "line_type": "Wireless"}],
            "text": "Your code is 1234",
        },
        "record_type": "event",
    },
    "meta": {"attempt": 1, "delivered_to": "https://hooks.example.com/webhooks/telnyx"},
}
received = {
    "data": {
        "event_type": "message.received",
        "id": "7ee12a8c-5ad4-4a47-b0a1-1f0d5b1e7c20",
        "occurred_at": "2026-11-29T10:01:00.000+00:00",
        "payload": {
            "id": "a7f4d0c4-6d88-4a47-9d49-3b1f3c3d2e10",
            "direction": "inbound",
            "type": "SMS",
            "from": {"phone_number": "+13125550123", "carrier": "T-Mobile USA", "line_type": "Wireless"},
            "to": [{"phone_number": "+13125550100", "status": "webhook_delivered", "carrier": "Telnyx", "line_type": "VoIP"}],
            "text": "STOP",
        },
        "record_type": "event",
    },
    "meta": {"attempt": 1, "delivered_to": "https://hooks.example.com/webhooks/telnyx"},
}

print(
    json.dumps(
        {
            "source": "make_telnyx_vector.py with the cryptography package "
            + version("cryptography")
            + " (OpenSSL's ed25519), seed bytes 0..31",
            "public_key": b64(public),
            "seed": b64(SEED),
            "deliveries": [
                delivery("message.finalized delivered", "1795946405", finalized),
                delivery("message.received STOP", "1795946460", received),
            ],
        },
        indent=2,
    )
)
