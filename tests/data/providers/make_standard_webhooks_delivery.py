"""Signs one delivery with the Standard Webhooks reference library, as a sender would.

Source of standard_webhooks_delivery.json. Run once, by hand:

    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install standardwebhooks
    /tmp/venv/bin/python tests/data/providers/make_standard_webhooks_delivery.py \
        > tests/data/providers/standard_webhooks_delivery.json

The secret is made as senders make theirs: `whsec_` and the base64 of 24 random bytes.
The tests read the JSON file; they never run this script or need the library.
"""

import base64
import json
import secrets
from datetime import datetime, timezone
from importlib.metadata import version

from standardwebhooks.webhooks import Webhook

secret = "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()
msg_id = "msg_" + secrets.token_hex(12)
now = datetime.now(tz=timezone.utc).replace(microsecond=0)
body = json.dumps(
    {
        "id": "evt_" + secrets.token_hex(8),
        "event": "invoice.paid",
        "data": {"invoice_id": "inv_" + secrets.token_hex(6), "amount": 4200},
    },
    separators=(",", ":"),
)
signature = Webhook(secret).sign(msg_id=msg_id, timestamp=now, data=body)
headers = {
    "webhook-id": msg_id,
    "webhook-timestamp": str(int(now.timestamp())),
    "webhook-signature": signature,
}
# The library's own verify must accept what it signed.
Webhook(secret).verify(body, headers)
print(
    json.dumps(
        {
            "source": "make_standard_webhooks_delivery.py with standardwebhooks "
            + version("standardwebhooks"),
            "secret": secret,
            "key_bytes": len(base64.b64decode(secret[len("whsec_"):])),
            "headers": headers,
            "body": body,
        },
        indent=2,
    )
)
