"""What every method shares: the client/server contract, the clients, the byte ledger, the losses."""
