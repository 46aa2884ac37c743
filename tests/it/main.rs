//! Integration tests: the real binary, real TLS, real sled, the real RabbitMQ.

mod util;

mod accept;
