-- The example order service's own table. The outbox's tables come from outbox-runtime's migrator.
CREATE TABLE orders (
    id          uuid PRIMARY KEY,
    customer_id uuid NOT NULL,
    status      text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'confirmed', 'cancelled')),
    version     bigint NOT NULL DEFAULT 1,
    total_cents bigint NOT NULL,
    currency    text NOT NULL,
    payment     jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
