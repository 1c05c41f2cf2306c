"""From the composed config to objects: the groups and what they decide (groups), nodes built
into attnlab's classes with every option checked (build, values), the resolvers that make run
directories (resolvers), and the options table read from the shipped YAML (options)."""
