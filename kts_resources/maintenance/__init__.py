"""Maintenance: rebuilding and checking what was lost or damaged — the store from the tier
(recover), the tier against the store (scrub, integrity), a log dir from the tier (restore), and
local segment indexes."""
