//! HTTP support for `idempotent`: a tower layer speaking the `Idempotency-Key` header, and the
//! one-time token endpoint. (Being built.)
