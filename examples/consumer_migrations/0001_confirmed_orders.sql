-- The consumer's projection of confirmed orders, in the consumer's own database.
-- `applications` counts how often the effect ran for an order: exactly-once shows as 1.
CREATE TABLE confirmed_orders (
    order_id       uuid PRIMARY KEY,
    total_cents    bigint NOT NULL,
    currency       text NOT NULL,
    order_version  bigint,
    event_id       uuid NOT NULL,
    applications   integer NOT NULL DEFAULT 1,
    applied_at     timestamptz NOT NULL DEFAULT now()
);
