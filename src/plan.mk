# src/plan.mk: plan files (schema, validation, uniform plans).
