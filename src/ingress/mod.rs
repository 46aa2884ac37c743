//! What arrives: the delivery as read off the wire, its signature check against the route's
//! secrets, and the event read out of the verified body. Pure apart from reading secrets.

pub mod event;
pub mod fields;
pub mod secrets;
pub mod trace;
