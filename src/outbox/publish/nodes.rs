//! The broker nodes' URLs, parsed once: when the config is resolved, before any port is
//! bound, into the form a connection is made from. Nothing else reads an AMQP URL.

use lapin::uri::AMQPUri;

use crate::config::{redact_url, Amqp};

/// Heartbeat interval asked for when the URL does not set one. The broker's default (60 s)
/// would take about two minutes to notice a black-holed link; until then every confirm
/// times out.
const DEFAULT_HEARTBEAT_SECS: u16 = 10;

/// One broker node.
#[derive(Debug, Clone)]
pub struct BrokerNode {
    /// What a connection is made from, with its heartbeat.
    pub(super) uri: AMQPUri,
    /// The URL as configured with its password redacted, for logs.
    pub(super) shown: String,
}

/// The nodes in the order they are tried (`amqp.urls`, or the one `amqp.url`); never empty.
#[derive(Debug, Clone)]
pub struct BrokerNodes(Vec<BrokerNode>);

/// A node URL that is not one; the message names the key and never holds the password.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {reason}")]
pub struct NodeUrlError {
    /// `amqp.url` or `amqp.urls[i]`.
    pub key: String,
    /// What is wrong with it.
    pub reason: String,
}

impl BrokerNodes {
    /// Parses the section's node URLs (after `url_env`/`urls_env` were applied).
    pub fn parse(amqp: &Amqp) -> Result<Self, NodeUrlError> {
        let nodes = amqp
            .nodes()
            .iter()
            .enumerate()
            .map(|(i, url)| {
                parse_node(url).map_err(|reason| NodeUrlError {
                    key: amqp.node_key(i),
                    reason,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self(nodes))
    }

    /// How many nodes there are.
    pub(super) fn len(&self) -> usize {
        self.0.len()
    }

    /// One round of connection attempts: every node once with its position, from `first`
    /// on, wrapping around.
    pub(super) fn round(&self, first: usize) -> impl Iterator<Item = (usize, &BrokerNode)> {
        let len = self.0.len();
        (0..len)
            .map(move |step| (first + step) % len)
            .map(|position| (position, &self.0[position]))
    }

    /// The URL of the node at `position` as logs show it (password redacted).
    pub(super) fn shown(&self, position: usize) -> &str {
        self.0.get(position).map_or("", |node| node.shown.as_str())
    }
}

fn parse_node(url: &str) -> Result<BrokerNode, String> {
    let shown = redact_url(url);
    if !(url.starts_with("amqp://") || url.starts_with("amqps://")) {
        return Err("must start with amqp:// or amqps://".to_owned());
    }
    let mut uri: AMQPUri = url.parse().map_err(|reason: String| {
        // lapin's message may quote the URL whole, password included.
        reason.replace(url, &shown)
    })?;
    // lapin's parser takes the host from `Url::domain`, which an IPv6 literal is not, and
    // falls back to `localhost`: the node would be looked for on this machine.
    if let Ok(url) = url::Url::parse(url) {
        if let Some(url::Host::Ipv6(address)) = url.host() {
            uri.authority.host = address.to_string();
        }
    }
    uri.query.heartbeat.get_or_insert(DEFAULT_HEARTBEAT_SECS);
    Ok(BrokerNode { uri, shown })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn amqp(urls: &[&str]) -> Amqp {
        Amqp {
            urls: urls.iter().map(|u| (*u).to_owned()).collect(),
            ..Amqp::default()
        }
    }

    #[test]
    fn a_url_without_a_heartbeat_asks_for_ten_seconds_and_one_with_keeps_its_own() {
        let nodes = BrokerNodes::parse(&amqp(&[
            "amqp://u:p@a:5672/%2f",
            "amqps://u:p@b:5671/v?heartbeat=30",
        ]))
        .expect("both parse");
        let heartbeats: Vec<_> = nodes.round(0).map(|(_, n)| n.uri.query.heartbeat).collect();
        assert_eq!(heartbeats, [Some(10), Some(30)]);
        assert_eq!(nodes.shown(1), "amqps://u:[redacted]@b:5671/v?heartbeat=30");
    }

    #[test]
    fn a_round_tries_every_node_once_from_the_one_after_the_lost_one() {
        let positions =
            |nodes: &BrokerNodes, first| nodes.round(first).map(|(i, _)| i).collect::<Vec<_>>();
        let one = BrokerNodes::parse(&Amqp::default()).expect("the default parses");
        assert_eq!(positions(&one, 0), [0]);
        let three =
            BrokerNodes::parse(&amqp(&["amqp://a", "amqp://b", "amqp://c"])).expect("three parse");
        assert_eq!(positions(&three, 0), [0, 1, 2]);
        assert_eq!(positions(&three, 2), [2, 0, 1]);
    }

    #[test]
    fn a_node_is_reached_at_the_host_its_url_names_a_name_or_an_address() {
        let nodes = BrokerNodes::parse(&amqp(&[
            "amqp://u:p@rabbit-0.example:5672/%2f",
            "amqp://10.1.2.3:5673/%2f",
            "amqps://[fd00::7]:5671/v",
        ]))
        .expect("all parse");
        let hosts: Vec<_> = nodes
            .round(0)
            .map(|(_, n)| (n.uri.authority.host.clone(), n.uri.authority.port))
            .collect();
        assert_eq!(
            hosts,
            [
                ("rabbit-0.example".to_owned(), 5672),
                ("10.1.2.3".to_owned(), 5673),
                ("fd00::7".to_owned(), 5671)
            ]
        );
    }

    #[test]
    fn a_bad_node_is_named_by_its_key_without_its_password() {
        let e = BrokerNodes::parse(&amqp(&["amqp://a/%2f", "http://b"])).expect_err("scheme");
        assert_eq!(
            e.to_string(),
            "amqp.urls[1]: must start with amqp:// or amqps://"
        );
        let e = BrokerNodes::parse(&amqp(&["amqp://u:secret@a:notaport/%2f"])).expect_err("port");
        assert!(e.to_string().starts_with("amqp.urls[0]: "), "{e}");
        assert!(!e.to_string().contains("secret"), "{e}");
        let e = BrokerNodes::parse(&amqp(&["amqp://a/%2f?heartbeat=often"])).expect_err("query");
        assert!(e.to_string().contains("amqp.urls[0]"), "{e}");
    }
}
