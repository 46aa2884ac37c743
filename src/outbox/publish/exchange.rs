//! The exchange hookgate publishes to, declared the one way hookgate declares it: a
//! consumer that declares it too (before hookgate starts, or after) agrees with it, where
//! a declaration with other options would fail the channel.

use lapin::options::ExchangeDeclareOptions;
use lapin::types::{FieldTable, ShortString};
use lapin::{Channel, ExchangeKind};

/// Declares `name` as a durable topic exchange: routing keys are event types, and the
/// exchange outlives a broker restart like the persistent messages sent to it.
pub async fn declare_exchange(channel: &Channel, name: ShortString) -> Result<(), lapin::Error> {
    let options = ExchangeDeclareOptions {
        durable: true,
        ..Default::default()
    };
    channel
        .exchange_declare(name, ExchangeKind::Topic, options, FieldTable::default())
        .await
}
