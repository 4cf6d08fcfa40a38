"""The `gossip` strategy: decentralized training over a mixing topology (docs/gossip.md)."""
