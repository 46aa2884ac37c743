//! The senders hookgate takes deliveries from, one file each with all that sender brings:
//! its signature check and signing, its delivery-id header, the `fields` and `guard` a
//! route of it starts with, the route keys it needs, the shape of its ids and, for a sender
//! that does not use `fields`, how it names its events. Pure: no I/O, no clock, no
//! randomness; callers pass the time and fresh ids in.
//!
//! [`Profile`] names a sender in a config and on the command line, and [`Profile::sender`]
//! is the one place a profile is matched. What a sender answers is the [`Sender`] trait
//! (`sender`); a built signature check is a [`Scheme`] (`scheme`). The HMAC helpers the
//! senders share are in `mac`; the body HMAC of botix and custom routes is `body_hmac`.

mod body_hmac;
mod botix;
mod custom;
mod mac;
mod scheme;
mod sender;
mod standard_webhooks;
mod telnyx;
mod twilio;
#[cfg(test)]
mod vectors;

use serde::{Deserialize, Serialize};

pub use body_hmac::{BodyHmac, CustomSignature};
pub use botix::{botix_header, BOTIX_REQUEST_ID, BOTIX_SIGNATURE};
pub use mac::{hmac_parts, Encoding};
pub use scheme::{Delivery, Scheme, Secret, SignatureError, Verify};
pub use sender::{IdKind, NamedEvent, OwnEvents, RouteKeys, Sender, SignRequest, Signed};
pub use standard_webhooks::{
    standard_webhooks_signature, StandardWebhooksScheme, WEBHOOK_ID, WEBHOOK_SECRET_PREFIX,
    WEBHOOK_SIGNATURE, WEBHOOK_TIMESTAMP,
};
pub use telnyx::{telnyx_signature, TelnyxScheme, TELNYX_SIGNATURE, TELNYX_TIMESTAMP};
pub use twilio::{
    twilio_signature, TwilioScheme, TWILIO_BODY_SHA256, TWILIO_IDEMPOTENCY_TOKEN, TWILIO_SIGNATURE,
};

/// The sender of a route's deliveries: config `profile`, `hookgate sign --profile`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Profile {
    /// `X-Botix-Signature: sha256=<hex>` (or bare hex) over the raw body.
    #[default]
    Botix,
    /// Standard Webhooks: `webhook-signature: v1,<base64>` over `id.timestamp.body`.
    StandardWebhooks,
    /// Twilio: `X-Twilio-Signature`, HMAC-SHA1 over `public_url` and the form parameters.
    Twilio,
    /// Telnyx: `telnyx-signature-ed25519` over `timestamp|body`, checked with a public key.
    Telnyx,
    /// Spelled out in the route's `signature` section.
    Custom,
}

impl Profile {
    /// What the sender brings: a new sender is a file of this folder and a line here.
    pub fn sender(self) -> &'static dyn Sender {
        match self {
            Profile::Botix => &botix::Botix,
            Profile::StandardWebhooks => &standard_webhooks::StandardWebhooks,
            Profile::Twilio => &twilio::Twilio,
            Profile::Telnyx => &telnyx::Telnyx,
            Profile::Custom => &custom::Custom,
        }
    }
}
