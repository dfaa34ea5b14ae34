def answer(user, **query):
    raise NotImplementedError
