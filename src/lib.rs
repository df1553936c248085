//! The program around the proxy: the demo, the proxy in front of simulated backends (`demo`).
//! The proxy itself is `switchboard-proxy`, the simulator `switchboard-sim`.

pub mod demo;
