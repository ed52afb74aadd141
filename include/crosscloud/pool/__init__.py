"""The shared pool: reservation ledger, inventory, membership, placement, admission and partition."""
