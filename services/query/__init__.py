"""What a tenant may see and say, enforced by NATS: the identities and their permissions
(``identities``), the read service that answers tenants' questions from the folded log
(``answer`` pure, ``service`` its shell), and the client side of both (``client``)."""
