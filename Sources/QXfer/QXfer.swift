// The library a program imports: `import QXfer` brings the connection API, the host identity,
// both stacks (`TLS()`, `QUIC()`), the race between them (`FirstOf { QUIC(); TLS() }`) and discovery, each a target of its own underneath
// (docs/ARCHITECTURE.md).
@_exported import QXferCore
@_exported import QXferDiscovery
@_exported import QXferIdentity
@_exported import QXferQUIC
@_exported import QXferRace
@_exported import QXferTLS
