//! The broker nodes of the `amqp` section: one node (`url`, or `url_env`) or the nodes of a
//! cluster (`urls`, or `urls_env`), which the publisher tries in order.

use super::redact::redact_url;
use super::schema::Amqp;

/// The longest AMQP short string, in bytes: the limit of exchange names, routing keys and
/// `message_id`. Config checks the exchange against it; the outbox checks routing keys.
pub const AMQP_SHORT_STRING_MAX: usize = 255;
/// Whether `text` fits an AMQP short string.
pub fn fits_short_string(text: &str) -> bool {
    text.len() <= AMQP_SHORT_STRING_MAX
}

/// The keys that name one node and the keys that name several.
const ONE_NODE: [&str; 2] = ["url", "url_env"];
const SEVERAL_NODES: [&str; 2] = ["urls", "urls_env"];

impl Amqp {
    /// The URLs of the broker nodes in the order they are tried: `urls` when set, else
    /// `url`. Never empty.
    pub fn nodes(&self) -> &[String] {
        if self.urls.is_empty() {
            std::slice::from_ref(&self.url)
        } else {
            &self.urls
        }
    }

    /// The key a node's URL is configured under, for error messages: `amqp.url`, or
    /// `amqp.urls[i]`.
    pub fn node_key(&self, index: usize) -> String {
        if self.urls.is_empty() {
            "amqp.url".to_owned()
        } else {
            format!("amqp.urls[{index}]")
        }
    }

    /// No node is listed twice (a node tried twice in a row is no failover). The URLs
    /// themselves are parsed once, by the publisher's `BrokerNodes`, when the config is
    /// resolved.
    pub(super) fn validate(&self) -> Result<(), String> {
        for (i, url) in self.nodes().iter().enumerate() {
            if self.nodes()[..i].contains(url) {
                return Err(format!("{}: listed twice", self.node_key(i)));
            }
        }
        Ok(())
    }

    /// The section with every URL's password replaced, for printing.
    pub(super) fn redacted(&self) -> Self {
        let mut copy = self.clone();
        copy.url = redact_url(&copy.url);
        for url in &mut copy.urls {
            *url = redact_url(url);
        }
        copy
    }
}

/// Checks the `amqp` section as written, before defaults fill it in: the default `url`
/// would otherwise hide a `url` written beside `urls`. One node or several, not both, and
/// a written `urls` list is not empty.
pub(super) fn check_written(tree: &serde_json::Value) -> Result<(), String> {
    let Some(section) = tree.get("amqp").and_then(serde_json::Value::as_object) else {
        return Ok(());
    };
    let one = ONE_NODE.iter().find(|k| section.contains_key(**k));
    let several = SEVERAL_NODES.iter().find(|k| section.contains_key(**k));
    if let (Some(one), Some(several)) = (one, several) {
        return Err(format!(
            "amqp.{several}: names several broker nodes, so amqp.{one} (one node) must not be set too; use one or the other"
        ));
    }
    if section
        .get("urls")
        .and_then(serde_json::Value::as_array)
        .is_some_and(Vec::is_empty)
    {
        return Err("amqp.urls: must list at least one URL".into());
    }
    Ok(())
}

/// The node URLs in the value of `urls_env`: separated by commas (a comma inside a password
/// is written `%2C`), blanks around them ignored.
pub fn split_urls(text: &str) -> Vec<String> {
    text.split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    const BASE: &str = "listen: {addr: 127.0.0.1:8443}\nroutes: [{name: r, path: /r, secrets: [{secret_env: A}]}]\n";

    fn parse(amqp: &str) -> Result<Config, String> {
        Config::parse(&format!("{BASE}amqp: {amqp}\n")).map_err(|e| e.to_string())
    }

    #[test]
    fn one_url_is_the_only_node() {
        let c = parse("{url: 'amqp://a:5672/%2f'}").expect("parses");
        assert_eq!(c.amqp.nodes(), ["amqp://a:5672/%2f"]);
    }

    #[test]
    fn urls_are_the_nodes_in_their_order() {
        let c = parse("{urls: ['amqp://b:5672/%2f', 'amqps://a:5671/%2f']}").expect("parses");
        assert_eq!(c.amqp.nodes(), ["amqp://b:5672/%2f", "amqps://a:5671/%2f"]);
    }

    #[test]
    fn url_and_urls_together_are_refused_by_name() {
        for amqp in [
            "{url: 'amqp://a/%2f', urls: ['amqp://b/%2f']}",
            "{url_env: X, urls: ['amqp://b/%2f']}",
            "{url: 'amqp://a/%2f', urls_env: Y}",
            // Even a `url` equal to the default is a second setting.
            "{url: 'amqp://guest:guest@127.0.0.1:5672/%2f', urls: ['amqp://b/%2f']}",
        ] {
            let e = parse(amqp).expect_err(amqp);
            assert!(
                e.contains("amqp.urls") && e.contains("amqp.url"),
                "{amqp}: {e}"
            );
            assert!(e.contains("one or the other"), "{amqp}: {e}");
        }
    }

    #[test]
    fn an_empty_or_repeated_node_list_is_refused() {
        let e = parse("{urls: []}").expect_err("empty");
        assert!(e.contains("amqp.urls: must list at least one URL"), "{e}");
        let e = parse("{urls: ['amqp://a/%2f', 'amqp://a/%2f']}").expect_err("twice");
        assert!(e.contains("amqp.urls[1]: listed twice"), "{e}");
    }

    #[test]
    fn every_node_password_is_redacted_when_printed() {
        let c =
            parse("{urls: ['amqp://u:pw-one@a/%2f', 'amqp://u:pw-two@b/%2f']}").expect("parses");
        let printed = c.redacted_yaml();
        assert!(
            !printed.contains("pw-one") && !printed.contains("pw-two"),
            "{printed}"
        );
        assert!(printed.contains("amqp://u:[redacted]@b/%2f"), "{printed}");
    }

    #[test]
    fn an_environment_list_splits_on_commas() {
        assert_eq!(
            split_urls(" amqp://a/%2f, amqp://b/%2f ,,"),
            ["amqp://a/%2f", "amqp://b/%2f"]
        );
        assert!(split_urls(" , ").is_empty());
    }
}
