"""Draft home of the guard's pure parts (placement, sequential test) until the runtime's rooms land."""
