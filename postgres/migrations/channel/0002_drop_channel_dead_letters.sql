-- The channel has no dead-letter topic any more: a worker writes its dead letters to the
-- dead-letter store (nudge_dead_letters), which the CLI reads. Rows left here are dead-lettered
-- triggers from before that, which no tool reads; a trigger carries no data a projection needs
-- (a projection that failed on an event shows it in its status), so they go with the table.
DROP TABLE IF EXISTS nudge_channel_dead_letters;
