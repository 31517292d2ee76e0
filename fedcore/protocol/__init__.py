"""The message type between master and parties, and the protocol tables of when each is answered."""
